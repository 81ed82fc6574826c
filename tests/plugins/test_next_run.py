"""The experiment page's "next run" panel over the source the last plan recorded, and the item page's input.

Each test builds a log whose items stand in every class the planner knows, against a source that
has changed since: k0 completed at v1 and then edited in the source (edited), k1 completed at v1 and
unchanged (skip, kept from another version), k2 created at v1 and never finished (demoted by the
plan at v2), k3 failed at v2 (failed), k4 created at v2 and not finished (replay), k5 new in the
source (fresh). The last plan, at v2, reads the source inline or from a JSONL, Parquet or Lance path
and records it the way ``DatagenPlanOperator`` does (``record_plan_source``).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import lance
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog, next_run, run_items
from airflow_provider_datagen.core.chunks import plan_chunks, record_plan_source
from airflow_provider_datagen.core.sources import prepare_items
from airflow_provider_datagen.core.store.source_ref import recorded_source
from tests.plugins.util import escaped

if TYPE_CHECKING:
    from pathlib import Path

    from fastapi.testclient import TestClient

P = "nextrun"
FIRST = [{"id": f"k{i}", "text": f"text {i}"} for i in range(5)]
# k0 edited, k5 new
NOW = [{"id": "k0", "text": "text 0, edited"}, *FIRST[1:], {"id": "k5", "text": "text 5"}]
CLASSES = {"fresh": 1, "replay": 1, "failed": 1, "edited": 1, "demoted": 1, "skip": 1}
ROW_RE = r"<tr><td>(\w+): [^<]*</td><td class='num'>(\d+)</td></tr>"


@pytest.fixture(autouse=True)
def fresh_reader() -> Any:
    from airflow_provider_datagen.plugins.data import reset_reader

    reset_reader()
    yield
    reset_reader()


def _ok(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"answer": item["text"].upper()}


def _fails(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    raise RuntimeError(f"model refused {item['id']}")


def write_source(fmt: str, rows: list[dict[str, Any]], directory: Path) -> Any:
    """``rows`` as an inline list or a file of format ``fmt`` (overwritten in place)."""
    if fmt == "inline":
        return rows
    path = directory / f"source.{fmt}"
    if fmt == "jsonl":
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        lance.write_dataset(pa.Table.from_pylist(rows), str(path), mode="overwrite")
    return str(path)


def plan(lg: CheckpointLog, source: Any, version: str, **kwargs: Any) -> Any:
    """What the plan task does: plan, then record the source it read."""
    planned = plan_chunks(lg, source, key_field="id", processor_version=version)
    return record_plan_source(
        lg, source, planned, key_field="id", processor_version=version, redo_completed="never", **kwargs
    )


def every_class(lg: CheckpointLog, fmt: str, directory: Path) -> Any:
    """The story of the module docstring; returns the source the last plan read."""
    fps = {s.item_id: s.fingerprint for s in prepare_items(FIRST, "id")}
    plan(lg, write_source(fmt, FIRST, directory), "v1")
    run_items(lg, FIRST[:2], _ok, processor_version="v1", writer_id="w1", epoch=1)
    w = lg.writer("script-v1", 2, processor_version="v1")
    with w.batch() as b:
        b.item_created("k2", input_fingerprint=fps["k2"])
        b.step_started("k2", step="process")
    run_items(lg, [FIRST[3]], _fails, processor_version="v2", writer_id="w2", epoch=3)
    w = lg.writer("script-v2", 4, processor_version="v2")
    with w.batch() as b:
        b.item_created("k4", input_fingerprint=fps["k4"])
    source = write_source(fmt, NOW, directory)
    plan(lg, source, "v2")
    return source


@pytest.mark.parametrize("fmt", ["inline", "jsonl", "parquet", "lance"])
def test_next_run_classifies_the_recorded_source(client: TestClient, ui_log: Any, tmp_path: Path, fmt: str) -> None:
    lg = ui_log(P, f"classes_{fmt}")
    source = every_class(lg, fmt, tmp_path)
    page = client.get(f"/datagen/experiments/{P}/classes_{fmt}").text
    panel = page[page.index("<h2 id='next-run'>") : page.index("<h2>Failures")]
    assert {k: int(v) for k, v in re.findall(ROW_RE, panel)} == CLASSES
    shown = "snapshot" if fmt == "inline" else fmt
    assert "The planner's classification of the 6 items of the source the last plan read" in panel
    assert f"({shown}, key field <code>id</code>, processor version <b>v2</b>, redo_completed never" in panel
    assert "Skipped but done under another processor version" in panel and "<b>v1</b> 1." in panel
    nr = client.get(f"/datagen/api/experiments/{P}/classes_{fmt}").json()["next_run"]
    assert nr["classes"] == {**CLASSES, "total": 6, "kept_other_version": {"v1": 1}}
    assert nr["source_known"] is True and nr["unreachable"] is None
    assert nr["source"]["processor_version"] == "v2" and nr["source"]["items"] == 6
    if fmt != "inline":
        assert nr["source"]["uri"] == source and nr["source"]["kind"] == "path"
    # the log-only view stays beside it (what the log alone says)
    assert (nr["replay"], nr["failed"], nr["done"]) == (2, 1, 2)


def test_a_new_plan_is_seen_without_a_new_log_version(client: TestClient, ui_log: Any, tmp_path: Path) -> None:
    """The panel is cached per log version and recorded source: a plan writes no event, yet is seen."""
    lg = ui_log(P, "replanned")
    source = write_source("jsonl", FIRST, tmp_path)
    plan(lg, source, "v1")
    run_items(lg, FIRST, _ok, processor_version="v1")
    api = f"/datagen/api/experiments/{P}/replanned"
    assert client.get(api).json()["next_run"]["classes"]["skip"] == 5
    version = lg.version
    # the file is edited in place and planned again: k0 edited, k5 fresh, same log version
    plan(lg, write_source("jsonl", NOW, tmp_path), "v1")
    assert lg.version == version
    classes = client.get(api).json()["next_run"]["classes"]
    assert (classes["edited"], classes["fresh"], classes["skip"]) == (1, 1, 4)


def test_no_recorded_source_falls_back_to_the_log(client: TestClient, ui_log: Any) -> None:
    lg = ui_log(P, "unrecorded")
    run_items(lg, FIRST, _ok)  # run_items outside a plan records no source
    page = client.get(f"/datagen/experiments/{P}/unrecorded").text
    panel = page[page.index("<h2 id='next-run'>") : page.index("<h2>Failures")]
    assert dict(re.findall(ROW_RE, panel)) == {"replay": "0", "failed": "0", "fresh": "0", "skip": "5"}
    assert "No plan recorded the source it read" in panel
    nr = client.get(f"/datagen/api/experiments/{P}/unrecorded").json()["next_run"]
    assert (nr["source_known"], nr["source"], nr["classes"], nr["unreachable"]) == (False, None, None, None)


def test_a_missing_source_is_said_and_the_log_view_shown(client: TestClient, ui_log: Any, tmp_path: Path) -> None:
    lg = ui_log(P, "gone")
    source = every_class(lg, "parquet", tmp_path)
    (tmp_path / "source.parquet").unlink()
    r = client.get(f"/datagen/experiments/{P}/gone")
    assert r.status_code == 200
    panel = r.text[r.text.index("<h2 id='next-run'>") : r.text.index("<h2>Failures")]
    assert f"The source the last plan read cannot be read now: <code>{source}</code>" in panel
    assert "does not exist" in panel
    # the log-only rows: k2, k4 replays (the log cannot tell k2 is demoted), k3 failed, k0 k1 done
    assert dict(re.findall(ROW_RE, panel)) == {"replay": "2", "failed": "1", "fresh": "0", "skip": "2"}
    nr = client.get(f"/datagen/api/experiments/{P}/gone").json()["next_run"]
    assert nr["classes"] is None and "does not exist" in nr["unreachable"]
    # the item page says the same of the input, and still shows
    item = client.get(f"/datagen/experiments/{P}/gone/item?id=k1")
    assert item.status_code == 200
    assert f"Not shown: the source {source} cannot be read now" in item.text


def test_a_path_source_past_the_ui_limit_is_not_classified(
    client: TestClient, ui_log: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server does not hold a big source's ids and fingerprints: the panel says why, log view kept."""
    monkeypatch.setattr(next_run, "UI_CLASSIFY_LIMIT", 5)  # the source has 6 items
    lg = ui_log(P, "too_large")
    source = every_class(lg, "parquet", tmp_path)
    panel = client.get(f"/datagen/experiments/{P}/too_large").text
    panel = panel[panel.index("<h2 id='next-run'>") : panel.index("<h2>Failures")]
    assert f"Not classified against the source the last plan read (<code>{source}</code>" in panel
    assert "has 6 items, more than the 5 the UI classifies" in panel
    assert dict(re.findall(ROW_RE, panel)) == {"replay": "2", "failed": "1", "fresh": "0", "skip": "2"}
    nr = client.get(f"/datagen/api/experiments/{P}/too_large").json()["next_run"]
    assert nr["classes"] is None and nr["unreachable"] is None
    assert "more than the 5 the UI classifies" in nr["not_classified"]
    # an inline source is its snapshot, bounded by what a DAG file can hold: always classified
    inline = ui_log(P, "inline_big")
    every_class(inline, "inline", tmp_path)
    assert client.get(f"/datagen/api/experiments/{P}/inline_big").json()["next_run"]["classes"] == {
        **CLASSES,
        "total": 6,
        "kept_other_version": {"v1": 1},
    }


UNREACHABLE_CONN = "datagen_next_run_s3"
SECRET = "next-run-secret-key-7Hq2"


def test_an_unreachable_object_store_is_said_without_secrets(
    client: TestClient, ui_log: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Lance source on an object store nobody answers at: the record names the connection, never its secret."""
    options = {
        "aws_endpoint": "http://127.0.0.1:9",  # the discard port: nothing listens
        "allow_http": "true",
        "aws_access_key_id": "AKIANEXTRUN",
        "aws_secret_access_key": SECRET,
        "aws_region": "us-east-1",
        "client_max_retries": "0",
        "client_retry_timeout": "1",
    }
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{UNREACHABLE_CONN.upper()}",
        json.dumps({"conn_type": "datagen", "host": str(tmp_path), "extra": {"storage_options": options}}),
    )
    lg = ui_log(P, "s3")
    run_items(lg, FIRST, _ok)
    local = write_source("lance", FIRST, tmp_path)
    plan(lg, local, "v1", conn_id=UNREACHABLE_CONN, storage_option_names=list(options))
    # the same record, for the source's copy on the object store (the plan ran where it was reachable)
    ref = recorded_source(lg.uri)
    assert ref is not None and ref.storage_option_names == tuple(sorted(options))
    from dataclasses import replace

    from airflow_provider_datagen.core.store.source_ref import record_source

    record_source(lg, replace(ref, uri="s3://datagen-sources/source.lance"))
    r = client.get(f"/datagen/experiments/{P}/s3")
    assert r.status_code == 200
    panel = r.text[r.text.index("<h2 id='next-run'>") : r.text.index("<h2>Failures")]
    assert "The source the last plan read cannot be read now: <code>s3://datagen-sources/source.lance</code>" in panel
    assert f"connection <code>{UNREACHABLE_CONN}</code>" in panel
    assert "127.0.0.1:9" in panel  # the read really went to the connection's endpoint
    api = client.get(f"/datagen/api/experiments/{P}/s3").text
    for text in (r.text, api):
        assert SECRET not in text and "AKIANEXTRUN" not in text


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "lance"])
def test_item_input_from_a_path_source(client: TestClient, ui_log: Any, tmp_path: Path, fmt: str) -> None:
    lg = ui_log(P, f"input_{fmt}")
    source = every_class(lg, fmt, tmp_path)
    base = f"/datagen/experiments/{P}/input_{fmt}/item"
    # k1: its row in the source is the input it was generated from, shown beside its output
    page = client.get(f"{base}?id=k1").text
    inp = page[page.index("<div id='input'>") : page.index("<div id='output'>")]
    assert escaped('"text": "text 1"') in inp and f"From the plan's source {source}; its fingerprint" in inp
    api = client.get(f"/datagen/api/experiments/{P}/input_{fmt}/item?id=k1").json()
    assert api["input"] == {"found": True, "value": FIRST[1], "from": f"source {source}", "message": None}
    # k0 was edited in the source after it completed: the new row is not passed off as its input
    page = client.get(f"{base}?id=k0").text
    assert "Not shown: " + escaped(f"the item's row in {source} has changed since") in page
    assert escaped("text 0, edited") not in page
    # k2 removed from the source (a new version of the file without it)
    write_source(fmt, [r for r in NOW if r["id"] != "k2"], tmp_path)
    api = client.get(f"/datagen/api/experiments/{P}/input_{fmt}/item?id=k2").json()
    assert api["input"]["found"] is False
    assert api["input"]["message"] == f"the source {source} no longer holds this item (its key is gone)"


@pytest.mark.parametrize("fmt", ["parquet", "lance", "jsonl"])
def test_item_input_by_an_int_key(client: TestClient, ui_log: Any, tmp_path: Path, fmt: str) -> None:
    """An int key column is searched by the int (item "7"); a string key "07" is another item."""
    rows = [{"id": i, "text": f"number {i}"} for i in range(10)]
    lg = ui_log(P, f"intkey_{fmt}")
    source = write_source(fmt, rows, tmp_path)
    plan(lg, source, "v1")
    run_items(lg, rows, _ok)
    api = client.get(f"/datagen/api/experiments/{P}/intkey_{fmt}/item?id=7").json()
    assert api["input"]["value"] == {"id": 7, "text": "number 7"}
