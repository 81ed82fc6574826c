"""OpenLineage: the datasets and facets each operator reports, and the events a real Airflow run emits.

The real runs go through ``dag.test()`` in a child process whose environment configures OpenLineage's
file transport: the provider's plugin decides when it is imported whether to register its listener
(``conf.is_disabled()`` is cached, and Airflow loads plugins and listeners once per process), so
setting the transport in this pytest process would count only if no test before had loaded them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.providers.openlineage.extractors.base import DefaultExtractor
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from airflow.utils.state import TaskInstanceState

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.chunk_spec import ChunkSpec
from airflow_provider_datagen.core.export_files import part_uris
from airflow_provider_datagen.operators import lineage
from airflow_provider_datagen.operators.batch import DatagenBatchOperator
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)
from dev.batch_server import serving
from tests._support.engine import open_log
from tests._support.ops_dag import ops_dag

if TYPE_CHECKING:
    from airflow_provider_datagen.core import CheckpointLog

REPO = Path(__file__).resolve().parents[2]


# --- naming ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("/data/src.jsonl", ("file", "/data/src.jsonl")),
        ("/data/out/../exports/x.lance/", ("file", "/data/exports/x.lance")),
        ("file:///data/src.parquet", ("file", "/data/src.parquet")),
        (
            "s3://bucket/prefix/datagen_checkpoints/p/e/log.lance",
            ("s3://bucket", "prefix/datagen_checkpoints/p/e/log.lance"),
        ),
        ("s3a://bucket/x.parquet", ("s3://bucket", "x.parquet")),
        ("s3://bucket", ("s3://bucket", "/")),
        ("gs://bkt/dir/x.lance", ("gs://bkt", "dir/x.lance")),
        ("gcs://bkt/x", ("gs://bkt", "x")),
        ("az://container/dir/x.lance", ("az://container", "dir/x.lance")),
        ("hf://user:secret@host/dir/x", ("hf://host", "dir/x")),
    ],
)
def test_dataset_ids_follow_the_openlineage_naming_spec(uri: str, expected: tuple[str, str]) -> None:
    assert lineage.dataset_id(uri) == expected


def test_an_inline_source_is_named_by_its_snapshot() -> None:
    spec = ChunkSpec(
        pipeline="p",
        experiment="e",
        processor_version="v1",
        redo_completed="never",
        source="/root/datagen_checkpoints/p/e/sources/abc.lance",
        snapshot=True,
        key_field="id",
        item_ids=("a",),
        label="a",
        index=0,
        plan_log_version=1,
    )
    inline = [{"id": "a"}]
    assert lineage.planned_source(inline, [spec]) == spec.source
    assert lineage.planned_source(inline, []) is None  # nothing planned: nothing was snapshotted
    assert lineage.planned_source("/data/src.jsonl", [spec]) == "/data/src.jsonl"
    assert lineage.chunk_source(spec, None) == spec.source
    assert lineage.chunk_source(None, "/data/src.jsonl") == "/data/src.jsonl"
    assert lineage.chunk_source(None, inline) is None


# --- facets ------------------------------------------------------------------------------------------


def _export_operator() -> DatagenExportOperator:
    return DatagenExportOperator(task_id="export", pipeline="p", experiment="e", destination="s3://bkt/out/x.lance")


def test_an_export_reports_the_log_in_and_the_destination_out_with_its_schema_and_rows() -> None:
    op = _export_operator()
    columns = (
        lineage.Column("item_id", "string"),
        lineage.Column("meta", "struct<len: int64>", fields=(lineage.Column("len", "int64"),)),
    )
    log = "s3://bkt/root/datagen_checkpoints/p/e/log.lance"
    lineage.record(op, inputs=[log], outputs=[op.destination], columns=columns, rows=7)
    got = op.get_openlineage_facets_on_complete(task_instance=None)

    assert [(d.namespace, d.name) for d in got.inputs] == [("s3://bkt", "root/datagen_checkpoints/p/e/log.lance")]
    assert [(d.namespace, d.name) for d in got.outputs] == [("s3://bkt", "out/x.lance")]
    out = got.outputs[0]
    assert out.outputFacets["outputStatistics"].rowCount == 7
    fields = out.facets["schema"].fields
    assert [(f.name, f.type) for f in fields] == [("item_id", "string"), ("meta", "struct<len: int64>")]
    assert [(f.name, f.type) for f in fields[1].fields] == [("len", "int64")]


def test_a_task_that_recorded_nothing_reports_nothing() -> None:
    # execute failed before it read anything: the provider then falls back to the task's inlets and outlets
    assert _export_operator().get_openlineage_facets_on_complete(task_instance=None) is None


def _recorded(op: Any, **what: Any) -> Any:
    lineage.record(op, **what)
    return op


def test_the_provider_extracts_our_facets_from_each_operator() -> None:
    """The provider's own extractor picks each operator's method: without it they would report no dataset."""
    src, log, snap = "/data/src.jsonl", "/root/datagen_checkpoints/p/e/log.lance", "/root/sources/x.lance"
    ops = {
        "plan": _recorded(DatagenPlanOperator(task_id="plan", pipeline="p", experiment="e", source=src), inputs=[src]),
        "map": _recorded(
            DatagenMapOperator(task_id="map", pipeline="p", experiment="e", process="m.o:d", source=src),
            inputs=[src],
            outputs=[log],
        ),
        "batch": _recorded(
            DatagenBatchOperator(task_id="batch", pipeline="p", experiment="e", process="m.o:d", source=src),
            inputs=[snap],
            outputs=[log],
        ),
    }
    manager = ExtractorManager()
    got = {}
    for name, op in ops.items():
        assert manager.get_extractor_class(op) is DefaultExtractor
        meta = manager.extract_metadata(
            dagrun=_FakeRun(), task=op, task_instance_state=TaskInstanceState.SUCCESS, task_instance=None
        )
        got[name] = ([(d.namespace, d.name) for d in meta.inputs], [(d.namespace, d.name) for d in meta.outputs])
    assert got == {
        "plan": ([("file", src)], []),
        "map": ([("file", src)], [("file", log)]),
        "batch": ([("file", snap)], [("file", log)]),
    }


class _FakeRun:
    run_id = "manual__1"


def test_columns_describe_json_text_and_renamed_fields() -> None:
    schema = pa.schema(
        [
            pa.field("item_id", pa.string()),
            pa.field("mixed", pa.string(), metadata={"datagen_encoding": "json"}),
            pa.field("field_key", pa.int64(), metadata={"datagen_field": "key"}),
            pa.field("input", pa.struct([pa.field("id", pa.string()), pa.field("n", pa.int64())])),
        ]
    )
    cols = lineage.columns_of(schema)
    assert [(c.name, c.type) for c in cols] == [
        ("item_id", "string"),
        ("mixed", "string"),
        ("field_key", "int64"),
        ("input", "struct<id: string, n: int64>"),
    ]
    assert cols[0].description is None
    assert "JSON text" in (cols[1].description or "")
    assert cols[2].description == "the field 'key'"
    assert [(c.name, c.type) for c in cols[3].fields] == [("id", "string"), ("n", "int64")]


# --- the exported columns, read back from each format -------------------------------------------------

ITEMS = [{"id": str(i), "n": i} for i in range(4)]


def _generate(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    return {
        "answer": f"a{n}",
        "tokens": n * 10,
        "score": n / 4,
        "ok": n % 2 == 0,
        "tags": [f"t{n}"],
        "meta": {"len": n, "model": "fake"},
        "image": bytes([n]) * 3,
    }


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> CheckpointLog:
    log = open_log(tmp_path_factory.mktemp("lineage"), "e")
    run_items(log, ITEMS, _generate)
    return log


TYPED = [
    ("item_id", "string"),
    ("key", "string"),
    ("answer", "string"),
    ("image", "large_binary"),
    ("meta", "struct<len: int64, model: string>"),
    ("ok", "bool"),
    ("score", "double"),
    ("tags", "list<item: string>"),
    ("tokens", "int64"),
]


@pytest.mark.parametrize(("fmt", "list_type"), [("lance", "list<item: string>"), ("parquet", "list<element: string>")])
def test_the_exported_columns_are_read_from_the_destination(
    generated: CheckpointLog, tmp_path: Path, fmt: str, list_type: str
) -> None:
    dest = str(tmp_path / f"out.{fmt}")
    export_results(generated, dest, format=fmt)
    cols = lineage.exported_columns(dest, None, fmt)
    assert cols is not None
    # as each format stores them: Parquet names a list's item "element"; Lance's blob column is its bytes
    assert [(c.name, c.type) for c in cols] == [(n, list_type if n == "tags" else t) for n, t in TYPED]
    meta = next(c for c in cols if c.name == "meta")
    assert [(c.name, c.type) for c in meta.fields] == [("len", "int64"), ("model", "string")]


def test_jsonl_columns_are_as_a_json_reader_infers_them(generated: CheckpointLog, tmp_path: Path) -> None:
    dest = str(tmp_path / "out.jsonl")
    export_results(generated, dest, format="jsonl")
    assert part_uris(dest)
    cols = lineage.exported_columns(dest, None, "jsonl")
    assert cols is not None
    by_name = {c.name: c.type for c in cols}
    assert list(by_name) == [name for name, _ in TYPED]  # the export's columns, in its order
    # JSON keeps no types: the bytes are base64 text and the reader infers the rest
    assert (by_name["image"], by_name["tokens"], by_name["ok"]) == ("string", "int64", "bool")


@pytest.mark.parametrize("on", [True, False])
def test_the_export_reads_its_schema_only_when_openlineage_is_enabled(
    generated: CheckpointLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    dest = str(tmp_path / "out.lance")
    result = export_results(generated, dest)
    op = DatagenExportOperator(task_id="export", pipeline="p", experiment="e", destination=dest)
    monkeypatch.setattr(lineage, "enabled", lambda: on)
    reads: list[str] = []
    real = lineage.exported_columns
    monkeypatch.setattr(lineage, "exported_columns", lambda *a: reads.append(a[0]) or real(*a))
    op.record_lineage(generated.uri, result)
    recorded = getattr(op, lineage.ATTRIBUTE)
    assert (recorded.inputs, recorded.outputs, recorded.rows) == ((generated.uri,), (dest,), 4)
    assert reads == ([dest] if on else [])
    assert (recorded.columns is not None) is on


def test_an_unreadable_destination_leaves_the_schema_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "bad.lance").mkdir()
    assert lineage.exported_columns(str(tmp_path / "bad.lance"), None, "lance") is None
    assert "could not read the export's schema" in caplog.text
    assert lineage.exported_columns(str(tmp_path / "none"), None, "parquet") is None  # no manifest, no parts


# --- real Airflow: the events of a dag.test() run ------------------------------------------------------


def _run_with_openlineage(dag_src: str, dag_id: str, dags_folder: Path, events: Path) -> list[dict[str, Any]]:
    """Run ``dag_src`` with ``dag.test()`` in a child process that emits OpenLineage events to ``events``."""
    env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "datagen_tests",
    }
    code = (
        "import sys\nfrom pathlib import Path\nfrom tests._support.dagtest import run_dag_file\n"
        f"run = run_dag_file({dag_src!r}, {dag_id!r}, dags_folder=Path({str(dags_folder)!r}))\n"
        "sys.exit(0 if run.state == 'success' else 3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"the DAG run failed ({done.returncode}):\n{done.stderr[-4000:]}"
    assert events.exists(), f"no OpenLineage event was written:\n{done.stderr[-4000:]}"
    return [json.loads(line) for line in events.read_text().splitlines() if line.strip()]


def _completed(events: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    found = [e for e in events if e["eventType"] == "COMPLETE" and e["job"]["name"] == job]
    assert found, f"no COMPLETE event of {job}: {sorted({(e['eventType'], e['job']['name']) for e in events})}"
    return found


def _ids(datasets: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def test_a_real_run_emits_the_source_the_log_and_the_destination(
    airflow_db: Path, dags_folder: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "text": f"item {i}"}) + "\n" for i in range(6)))
    dag = ops_dag(
        "ol_ops",
        tmp_path,
        source=str(src),
        experiment=f"ol{os.getpid()}",
        process="tests._support.procs:always_ok",
        chunk=3,
        export_extra=', format="parquet"',
    )
    events = _run_with_openlineage(dag, "ol_ops", dags_folder, tmp_path / "events.jsonl")

    from airflow_provider_datagen.hooks.datagen import DatagenHook

    log = ("file", DatagenHook().get_log("ops", f"ol{os.getpid()}").uri)
    assert all(e["job"]["namespace"] == "datagen_tests" for e in events)
    (plan,) = _completed(events, "ol_ops.plan")
    assert _ids(plan["inputs"]) == [("file", str(src))]
    generate = _completed(events, "ol_ops.generate")
    assert len(generate) == 2  # one per mapped chunk
    for chunk in generate:
        assert _ids(chunk["inputs"]) == [("file", str(src))]
        assert _ids(chunk["outputs"]) == [log]
    (export,) = _completed(events, "ol_ops.export")
    assert _ids(export["inputs"]) == [log]
    (out,) = export["outputs"]
    assert (out["namespace"], out["name"]) == ("file", str(tmp_path / "ol_ops_export.lance"))
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 6
    fields = [(f["name"], f["type"]) for f in out["facets"]["schema"]["fields"]]
    # always_ok's output and the item's key: what the Parquet export holds
    written = pq.read_schema(part_uris(str(tmp_path / "ol_ops_export.lance"))[0])
    assert fields == [(f.name, str(f.type)) for f in written]
    assert [name for name, _ in fields[:2]] == ["item_id", "key"]


def test_a_real_deferred_batch_run_reports_the_snapshot_and_the_log(
    airflow_db: Path, dags_folder: Path, tmp_path: Path
) -> None:
    """An inline source is read from its snapshot; a deferred batch task reports after it resumes."""
    from tests.operators.test_batch import batch_dag, batch_log

    with serving(complete_after_polls=1) as fake:
        dag = batch_dag("ol_batch", fake=fake, n=4)
        events = _run_with_openlineage(dag, "ol_batch", dags_folder, tmp_path / "events.jsonl")
        assert fake.creates == 1  # the chunk went to the batch API

    log = ("file", batch_log("ol_batch").uri)
    (plan,) = _completed(events, "ol_batch.plan")
    (snapshot,) = _ids(plan["inputs"])
    assert snapshot[0] == "file" and "/sources/" in snapshot[1] and snapshot[1].endswith(".lance")
    (generate,) = _completed(events, "ol_batch.generate")
    assert _ids(generate["inputs"]) == [snapshot]
    assert _ids(generate["outputs"]) == [log]
