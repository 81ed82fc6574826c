"""LogWriter.commit_completions: the columnar commit writes exactly what staging each event does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core.events import encode_value
from airflow_provider_datagen.core.schema import StepKind
from airflow_provider_datagen.core.store.log import CheckpointLog
from airflow_provider_datagen.exceptions import FencingError, InvalidEventError

if TYPE_CHECKING:
    import pyarrow as pa

STEP = "answer"


def _values(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    fields: dict[str, Any] = {"output": f"answer {i}"}
    if i % 3 == 0:
        fields["extra"] = {"n": i, "tags": ["a", "b"], "score": 0.5}
    if i % 7 == 0:
        fields["blob"] = b"\x00bytes" * (i + 1)
    value = {"attempt": 1 + i % 2, "usage": [{"model": "openai:m", "input_tokens": i}], "batch": True}
    return fields, value


def _prepare(root: Any, name: str, ids: list[str]) -> CheckpointLog:
    """A log where half the items were created by an earlier writer (the new one must look them up)
    and one already holds a field from an earlier generation step."""
    log = CheckpointLog.open(str(root / name), pipeline="p", experiment="e")
    w = log.writer("earlier", 1, processor_version="v1")
    with w.batch() as b:
        for iid in ids[::2]:
            b.item_created(iid, input_fingerprint=f"fp-{iid}")
        b.field_set(ids[0], "output", "an older answer", step=STEP)
    return log


def _table(log: CheckpointLog) -> pa.Table:
    table = log.table.dataset().to_table()  # type: ignore[union-attr]
    return table.drop_columns(["created_at"]).sort_by([("item_id", "ascending"), ("item_seq", "ascending")])


@pytest.mark.parametrize("ids", [[f"k{i:03d}" for i in range(40)], [f"root/{i}" for i in range(9)] + ["päth ü"]])
def test_the_columnar_commit_equals_staging_each_event(tmp_path: Any, ids: list[str]) -> None:
    one_by_one = _prepare(tmp_path, "staged", ids)
    columnar = _prepare(tmp_path, "columnar", ids)
    w1 = one_by_one.writer("w", 2, processor_version="v2", airflow={"dag_id": "d", "map_index": 3})
    w2 = columnar.writer("w", 2, processor_version="v2", airflow={"dag_id": "d", "map_index": 3})
    with w1.batch() as b:  # the items the earlier writer did not create are created by this one
        for iid in ids[1::2]:
            b.item_created(iid, input_fingerprint=f"fp-{iid}")
    with w2.batch() as b:
        for iid in ids[1::2]:
            b.item_created(iid, input_fingerprint=f"fp-{iid}")
    rows = []
    with w1.batch() as b:
        for i, iid in enumerate(ids):
            fields, value = _values(i)
            for name, v in fields.items():
                b.field_set(iid, name, v, step=STEP)
            b.step_completed(iid, step=STEP, step_kind=StepKind.STEP.value, value=value)
            b.terminal(iid)
            rows.append(
                (
                    iid,
                    [(name, encode_value(v, blob_threshold=columnar.blob_threshold)) for name, v in fields.items()],
                    encode_value(value),
                )
            )
    written = w2.commit_completions(STEP, rows)
    assert written == w1.events_written - len(ids[1::2])
    assert _table(columnar).equals(_table(one_by_one))
    # the same sequence, fingerprint and field modes (whether the cursor owns its mode map may differ)
    assert {k: list(v[:3]) for k, v in w2.item_cursors.items()} == {k: list(v[:3]) for k, v in w1.item_cursors.items()}
    for iid in ids:
        assert columnar.item_state(iid) == one_by_one.item_state(iid)


def test_an_append_mode_field_is_refused_before_any_write(tmp_path: Any) -> None:
    log = CheckpointLog.open(str(tmp_path / "log"), pipeline="p", experiment="e")
    w = log.writer("w", 1, processor_version="v1")
    with w.batch() as b:
        b.item_created("a", input_fingerprint="fa")
        b.item_created("b", input_fingerprint="fb")
        b.field_append("b", "output", "x", step=STEP)
    version = log.table.dataset().version  # type: ignore[union-attr]
    rows = [(iid, [("output", encode_value("y"))], encode_value({"attempt": 1})) for iid in ("a", "b")]
    with pytest.raises(InvalidEventError, match="field 'output' was written with FIELD_APPEND"):
        w.commit_completions(STEP, rows)
    with pytest.raises(InvalidEventError, match="completed twice in one commit"):
        w.commit_completions(STEP, [rows[0], rows[0]])
    with pytest.raises(InvalidEventError, match="field name"):
        w.commit_completions(STEP, [("a", [("", encode_value("y"))], encode_value({"attempt": 1}))])
    assert log.table.dataset().version == version  # type: ignore[union-attr]
    assert log.item_state("a").status.value == "running"


def test_prime_created_tells_the_writer_what_its_lookup_would_and_fences_the_same(tmp_path: Any) -> None:
    log = CheckpointLog.open(str(tmp_path / "log"), pipeline="p", experiment="e")
    with log.writer("earlier", 3, processor_version="v1").batch() as b:
        for iid in ("a", "b", "c"):
            b.item_created(iid, input_fingerprint=f"fp-{iid}")
    table = log.states_of(["a", "b", "c"])
    columns = [table[c].to_pylist() for c in ("item_id", "last_seq", "input_fingerprint", "max_epoch")]

    primed = log.writer("w", 3, processor_version="v1")
    primed.item_cursors["c"] = [7, "mine", {"output": "set"}, True]  # a cursor the writer has is kept
    primed.prime_created(*columns)
    for iid in "ab":  # what the writer would fold itself (the reference fold of the item)
        state = log.item_state(iid)
        assert list(primed.item_cursors[iid][:3]) == [state.last_seq, state.input_fingerprint, dict(state.field_modes)]
    assert primed.item_cursors["c"] == [7, "mine", {"output": "set"}, True]

    older = log.writer("w", 2, processor_version="v1")
    with pytest.raises(FencingError, match=r"writer 'w' at epoch 2 may not write item 'a': epoch 3 already owns it"):
        older.prime_created(*columns)
