"""The export: one typed column per field, JSON text for mixed types, include_input, a content fingerprint
that ignores history and layout, no new version when unchanged, and no export of a missing experiment."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import export_results, results_fingerprint, run_items
from airflow_provider_datagen.core.export import collect_results
from airflow_provider_datagen.exceptions import ConfigurationError, ExperimentNotFoundError
from tests._support.engine import fields_of_export, open_log

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

ITEMS = [{"id": str(i), "text": f"prompt {i}", "n": i} for i in range(5)]

#: The fingerprint of ``_generate``'s results over ITEMS, as every release so far computed it (sha256 of
#: "<item id>\x1f<canonical fields JSON>\n" in id order): a changed layout must not change it.
PINNED_FINGERPRINT = "8cb84ff4213a902b78645c638e055395bd75573fadef7a8c2372c22d097a8b32"


def _generate(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    return {
        "answer": item["text"].upper(),
        "tokens": n * 10,
        "score": n / 4,
        "ok": n % 2 == 0,
        "tags": [f"t{n}", "x"],
        "meta": {"len": len(item["text"]), "model": "fake"},
        "mixed": n if n % 2 else f"n{n}",
        "ratio": n if n == 2 else n + 0.5,
        "shape": {"a": 1} if n < 3 else {"b": 2},
    }


def _log(tmp_path: Path, experiment: str = "e", items: list[dict[str, Any]] = ITEMS, **kw: Any) -> CheckpointLog:
    log = open_log(tmp_path, experiment)
    run_items(log, items, _generate, **kw)
    return log


def _schema(dest: Path) -> pa.Schema:
    return lance.dataset(str(dest)).schema


def _version(dest: Path) -> int:
    return int(lance.dataset(str(dest)).version)


def test_each_field_is_a_typed_column(tmp_path: Path) -> None:
    dest = tmp_path / "out.lance"
    result = export_results(_log(tmp_path), str(dest))
    schema = _schema(dest)
    assert schema.names == [
        "item_id",
        "key",
        "answer",
        "meta",
        "mixed",
        "ok",
        "ratio",
        "score",
        "shape",
        "tags",
        "tokens",
    ]
    types = {f.name: f.type for f in schema}
    assert types["answer"] == pa.string() and types["tokens"] == pa.int64() and types["score"] == pa.float64()
    assert types["ok"] == pa.bool_() and types["tags"] == pa.list_(pa.string())
    assert types["meta"] == pa.struct([("len", pa.int64()), ("model", pa.string())])
    row = lance.dataset(str(dest)).to_table().to_pylist()[1]
    assert row["item_id"] == row["key"] == "1"
    assert row["answer"] == "PROMPT 1" and row["tokens"] == 10 and row["score"] == 0.25 and row["ok"] is False
    assert row["tags"] == ["t1", "x"] and row["meta"] == {"len": 8, "model": "fake"}
    assert result["rows"] == 5 and result["changed"] is True and result["renamed_fields"] == {}


def test_a_field_whose_values_do_not_share_a_type_is_json_text(tmp_path: Path) -> None:
    dest = tmp_path / "out.lance"
    log = _log(tmp_path)
    result = export_results(log, str(dest))
    # ints and strings; an int among floats (Arrow would make it 2.0); dicts with different keys (Arrow
    # would fill the missing keys with nulls): none of them is held exactly by one Arrow type
    assert result["json_fields"] == ["mixed", "ratio", "shape"]
    schema = _schema(dest)
    for name in result["json_fields"]:
        assert schema.field(name).type == pa.string()
        assert schema.field(name).metadata == {b"datagen_encoding": b"json"}
    assert schema.field("answer").metadata is None
    rows = {r["item_id"]: r for r in lance.dataset(str(dest)).to_table().to_pylist()}
    assert rows["1"]["mixed"] == "1" and rows["2"]["mixed"] == '"n2"'
    assert json.loads(rows["2"]["ratio"]) == 2 and json.loads(rows["3"]["ratio"]) == 3.5
    # read back, every item's fields are exactly what was generated
    assert fields_of_export(dest) == {k: json.loads(v) for k, v in collect_results(log).items()}


def test_fields_named_like_export_columns_or_with_dots_are_renamed(tmp_path: Path) -> None:
    log = open_log(tmp_path, "names")
    run_items(log, ITEMS[:2], lambda item, ctx: {"key": 1, "input": "i", "item_id": 2, "a.b": 3, "field_key": 4})
    dest = tmp_path / "out.lance"
    result = export_results(log, str(dest))
    assert result["renamed_fields"] == {
        "a.b": "a_b",
        "input": "field_input",
        "item_id": "field_item_id",
        "key": "field_key_2",
    }
    schema = _schema(dest)
    assert schema.field("field_key_2").metadata == {b"datagen_field": b"key"}
    assert schema.field("field_key").metadata is None  # a real field keeps its own name
    row = lance.dataset(str(dest)).to_table().to_pylist()[0]
    assert (row["item_id"], row["key"], row["field_key_2"], row["field_key"], row["a_b"]) == ("0", "0", 1, 4, 3)
    assert fields_of_export(dest)["0"] == {"key": 1, "input": "i", "item_id": 2, "a.b": 3, "field_key": 4}


def test_include_input_adds_the_source_item_as_a_struct(tmp_path: Path) -> None:
    log = _log(tmp_path)
    dest = tmp_path / "out.lance"
    without = export_results(log, str(dest))
    assert "input" not in _schema(dest).names
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps(i) + "\n" for i in reversed(ITEMS)))  # any order, any format
    result = export_results(log, str(dest), include_input=True, source=str(src))
    schema = _schema(dest)
    assert schema.names[-1] == "input"
    assert schema.field("input").type == pa.struct([("id", pa.string()), ("n", pa.int64()), ("text", pa.string())])
    rows = lance.dataset(str(dest)).to_table().to_pylist()
    assert [r["input"] for r in rows] == ITEMS
    # a new layout, the same content digest
    assert result["changed"] is True and result["fingerprint"] == without["fingerprint"]


def test_include_input_that_cannot_be_honoured_is_refused_before_writing(tmp_path: Path) -> None:
    log = _log(tmp_path)
    dest = tmp_path / "out.lance"
    with pytest.raises(
        ConfigurationError,
        match=r"^export_results: include_input=True needs the items' inputs, and the log keeps only their "
        r"fingerprints; pass source= and key_field= as given to the plan",
    ):
        export_results(log, str(dest), include_input=True)
    with pytest.raises(
        ConfigurationError, match=r"^export_results: source=.* lacks 2 of the exported items \(e\.g\. key '3'"
    ):
        # every completed item, so the inputs of all of them (source= alone exports its items only)
        export_results(log, str(dest), include_input=True, source=ITEMS[:3], include_removed=True)
    edited = [dict(i) for i in ITEMS]
    edited[4]["text"] = "edited"
    with pytest.raises(
        ConfigurationError,
        match=r"holds other inputs than 1 exported items were generated from \(e\.g\. key '4', edited",
    ):
        export_results(log, str(dest), include_input=True, source=edited)
    with pytest.raises(ConfigurationError, match=r"^export_results: include_input='yes' is not a bool"):
        export_results(log, str(dest), include_input="yes", source=ITEMS)  # type: ignore[arg-type]
    assert not dest.exists()


def test_fingerprint_is_the_content_digest_whatever_the_history(tmp_path: Path) -> None:
    clean = export_results(_log(tmp_path, "clean"), str(tmp_path / "clean.lance"))
    assert clean["fingerprint"] == PINNED_FINGERPRINT

    # another history: failures first, then a rerun, items in another order, other commit cadence
    log = open_log(tmp_path, "flaky")
    failing = {"1", "3"}

    def flaky(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] in failing:
            raise RuntimeError("transient")
        return _generate(item, ctx)

    run_items(log, list(reversed(ITEMS)), flaky, checkpoint_every=1)
    failing.clear()
    run_items(log, ITEMS, flaky, epoch=log.next_epoch())
    resumed = export_results(log, str(tmp_path / "resumed.lance"), include_input=True, source=ITEMS)
    assert resumed["fingerprint"] == clean["fingerprint"] == results_fingerprint(collect_results(log))
    assert resumed["rows"] == clean["rows"] == 5


def test_an_unchanged_export_writes_no_new_version(tmp_path: Path) -> None:
    log = _log(tmp_path, items=ITEMS[:3])
    dest = tmp_path / "out.lance"
    first = export_results(log, str(dest))
    assert first["changed"] is True and _version(dest) == 1
    again = export_results(log, str(dest))
    assert again == {**first, "changed": False} and _version(dest) == 1

    run_items(log, ITEMS, _generate, epoch=log.next_epoch())  # two more items: new content
    grown = export_results(log, str(dest))
    assert grown["changed"] is True and grown["rows"] == 5 and _version(dest) == 2
    assert export_results(log, str(dest))["changed"] is False and _version(dest) == 2

    # another layout of the same content is a change; so is a destination altered by someone else
    assert export_results(log, str(dest), include_input=True, source=ITEMS)["changed"] is True
    assert _version(dest) == 3
    assert export_results(log, str(dest), include_input=True, source=ITEMS)["changed"] is False
    table = lance.dataset(str(dest)).to_table()
    lance.write_dataset(table.slice(0, 1), str(dest), mode="append")
    assert export_results(log, str(dest), include_input=True, source=ITEMS)["changed"] is True
    assert lance.dataset(str(dest)).count_rows() == 5


def test_the_export_of_a_missing_experiment_fails_and_writes_nothing(tmp_path: Path) -> None:
    _log(tmp_path, "real")
    typo = open_log(tmp_path, "reall")
    assert not typo.exists()
    dest = tmp_path / "out.lance"
    with pytest.raises(ExperimentNotFoundError) as info:
        export_results(typo, str(dest))
    message = str(info.value)
    assert message.startswith(f"experiment 'engine'/'reall' does not exist: it has no log under root {str(tmp_path)!r}")
    assert "Experiments of pipeline 'engine' under this root: 'real'." in message
    assert message.endswith(
        ". Nothing was exported. Check the pipeline and experiment names (the plan's and the generate task's) and "
        "the connection's root, or run the generation first."
    )
    assert not dest.exists() and not typo.exists()  # opening and exporting never create the log
    other = open_log(tmp_path, "x", pipeline="nowhere")
    with pytest.raises(ExperimentNotFoundError, match=r"No experiment of pipeline 'nowhere' exists under this root"):
        export_results(other, str(dest))
    assert not os.path.exists(other.uri)


def test_an_input_key_mixing_a_datetime_with_text_is_exported_as_tagged_json(tmp_path: Path) -> None:
    import datetime as dt

    from airflow_provider_datagen.core.events import decode_source_json

    when = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    items = [{"id": "a", "at": when}, {"id": "b", "at": "soon"}]
    log = open_log(tmp_path, "mixed")
    run_items(log, items, lambda item, ctx: {"ok": True})
    dest = tmp_path / "out.lance"
    result = export_results(log, str(dest), include_input=True, source=items)
    table = lance.dataset(str(dest)).to_table()
    inputs = {row["item_id"]: row["input"] for row in table.to_pylist()}
    assert decode_source_json(inputs["a"]["at"]) == when
    assert inputs["b"]["at"] == '"soon"'
    assert result["rows"] == 2
