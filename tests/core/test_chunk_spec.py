"""ChunkSpec: the plan's XCom encodes and decodes one way, reads the previous versions' dicts, refuses newer ones."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog, ChunkSpec
from airflow_provider_datagen.core.chunk_spec import CHUNK_FORMAT, FORMAT_KEY
from airflow_provider_datagen.core.chunks import chunk_items, plan_chunks
from airflow_provider_datagen.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

#: A chunk as the provider wrote it before ChunkSpec (the keys and values of its ``_descriptor``).
OLD_DESCRIPTOR: dict[str, Any] = {
    "pipeline": "p",
    "experiment": "e",
    "processor_version": "v2",
    "redo_completed": "other_version",
    "source": "/data/items.parquet",
    "snapshot": False,
    "key_field": "id",
    "item_ids": ["a", "b", "c"],
    "label": "a … c (3 items)",
    "index": 4,
    "plan_log_version": 17,
    "rows": [[0, 2], [5, 6]],
}


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"k{i}", "text": f"item {i}"} for i in range(n)]


def test_a_planned_spec_goes_through_json_and_back_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "items.parquet"
    pq.write_table(pa.Table.from_pylist(_items(5)), path)
    for name, source in (("inline", _items(5)), ("parquet", str(path))):
        log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment=name)
        specs = plan_chunks(log, source, chunk_size=3, processor_version="v3").specs
        assert [s.item_ids for s in specs] == [("k0", "k1", "k2"), ("k3", "k4")]
        assert [s.rows for s in specs] == ([None, None] if name == "inline" else [((0, 3),), ((3, 5),)])
        for spec in specs:
            xcom = json.loads(json.dumps(spec.to_xcom()))  # what Airflow stores and hands the map task
            assert xcom[FORMAT_KEY] == CHUNK_FORMAT
            assert ChunkSpec.from_xcom(xcom) == spec
            assert (spec.processor_version, spec.redo_completed, spec.snapshot) == ("v3", "never", name == "inline")


def test_the_xcom_keeps_the_descriptor_keys_and_adds_the_format(tmp_path: Path) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    planned = plan_chunks(log, _items(4), chunk_size=2)
    descriptors = planned.chunks
    assert [{**d, FORMAT_KEY: CHUNK_FORMAT} for d in descriptors] == [s.to_xcom() for s in planned.specs]
    assert list(planned.specs[0].to_xcom()) == [*(k for k in OLD_DESCRIPTOR if k != "rows"), FORMAT_KEY]


def test_a_dict_of_the_previous_version_is_read_as_format_1() -> None:
    spec = ChunkSpec.from_xcom(OLD_DESCRIPTOR)
    assert spec == ChunkSpec(
        pipeline="p",
        experiment="e",
        processor_version="v2",
        redo_completed="other_version",
        source="/data/items.parquet",
        snapshot=False,
        key_field="id",
        item_ids=("a", "b", "c"),
        label="a … c (3 items)",
        index=4,
        plan_log_version=17,
        rows=((0, 2), (5, 6)),
        format=1,
    )
    assert spec.to_xcom() == {**OLD_DESCRIPTOR, FORMAT_KEY: 1}
    # the plans before redo_completed travelled in the chunk: the planner's default
    older = {k: v for k, v in OLD_DESCRIPTOR.items() if k != "redo_completed"}
    assert ChunkSpec.from_xcom(older).redo_completed == "never"


def test_a_newer_format_is_refused_naming_the_fix() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"^chunk chunk_format=2 is not one this provider reads \(it reads 1\): the plan task ran a newer "
        r"airflow-provider-datagen; run the plan and map tasks on the same version$",
    ):
        ChunkSpec.from_xcom({**OLD_DESCRIPTOR, FORMAT_KEY: 2})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"item_ids": None}, r"^chunk has no item_ids list; pass expand_kwargs\(plan.output\) unchanged$"),
        ({"item_ids": [1, 2]}, r"^chunk has no item_ids list; "),
        ({"pipeline": 3}, r"^chunk pipeline=3 is not a string; pass expand_kwargs\(plan.output\) unchanged$"),
        ({"index": True}, r"^chunk index=True is not an int; "),
        ({"rows": [[0]]}, r"^chunk rows=\[\[0\]\] is not a list of \[start, stop\] ranges; "),
        ({"source": None}, r"^chunk source=None is not a string; "),
    ],
)
def test_a_malformed_chunk_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ChunkSpec.from_xcom({**OLD_DESCRIPTOR, **change})


def test_a_chunk_without_a_required_field_or_not_a_dict_is_refused() -> None:
    gone = {k: v for k, v in OLD_DESCRIPTOR.items() if k != "experiment"}
    with pytest.raises(ConfigurationError, match=r"^chunk has no 'experiment'; pass expand_kwargs"):
        ChunkSpec.from_xcom(gone)
    with pytest.raises(ConfigurationError, match=r"^chunk 6 is not a chunk dict; "):
        ChunkSpec.from_xcom(6)


def test_a_task_is_checked_against_the_plan_only_for_what_it_gives() -> None:
    spec = ChunkSpec.from_xcom(OLD_DESCRIPTOR)
    spec.check_task(pipeline="p", experiment="e", processor_version=None, redo_completed=None)
    spec.check_task(pipeline="p", experiment="e", processor_version="v2", redo_completed="other_version")
    with pytest.raises(
        ConfigurationError,
        match=r"^processor_version mismatch: the plan produced chunks for processor_version='v2' but this task has "
        r"processor_version='v1'; give DatagenPlanOperator and DatagenMapOperator the same processor_version$",
    ):
        spec.check_task(pipeline="p", experiment="e", processor_version="v1")
    with pytest.raises(ConfigurationError, match=r"^redo_completed mismatch: .*'other_version' but this task has "):
        spec.check_task(pipeline="p", experiment="e", processor_version=None, redo_completed="never")


def test_chunk_items_takes_the_plans_version_when_the_task_gives_none(tmp_path: Path) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    spec = plan_chunks(log, _items(3), processor_version="v7").specs[0]
    items = chunk_items(spec.to_xcom(), pipeline="p", experiment="e", processor_version=None)
    assert [s.item_id for s in items] == ["k0", "k1", "k2"]
    assert chunk_items(spec, pipeline="p", experiment="e", processor_version="v7") == items
