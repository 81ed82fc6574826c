"""``DatagenPlanOperator`` records the source it read beside the log, names only, for the UI's next-run panel."""

from __future__ import annotations

import json
import os
import textwrap
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from airflow_provider_datagen.core.store.paths import SNAPSHOTS_DIR, experiment_uri, source_ref_uri
from airflow_provider_datagen.core.store.source_ref import recorded_source

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

CONN = "datagen_record"
SECRET = "record-secret-value-9Xk"

DAG = """
import pendulum
from airflow.sdk import DAG
from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="rec", experiment={experiment!r}, source={source!r},
                               processor_version="v3", datagen_conn_id={conn!r}, chunk_size=4)
    DatagenMapOperator.partial(task_id="generate", pipeline="rec", experiment={experiment!r},
                               processor_version="v3", datagen_conn_id={conn!r},
                               process="tests._support.procs:always_ok").expand_kwargs(plan.output)
"""


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": str(i), "text": f"item {i}"} for i in range(n)]


@pytest.fixture
def conn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A datagen connection whose storage options hold a secret (a local root ignores the option)."""
    root = tmp_path / "root"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN.upper()}",
        json.dumps({"conn_type": "datagen", "host": str(root), "extra": {"storage_options": {"token": SECRET}}}),
    )
    return root


def _log_uri(root: Path, experiment: str) -> str:
    return f"{root}/datagen_checkpoints/rec/{experiment}/log.lance"


def _no_secret_in(path: str) -> None:
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                assert SECRET.encode() not in fh.read(), f"the secret is in {name}"


def test_a_path_source_is_recorded_by_name(run_dag_file: Callable[..., Any], conn: Path, tmp_path: Path) -> None:
    source = tmp_path / "items.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _items(6)))
    dag = DAG.format(dag_id="rec_path", experiment="path", source=str(source), conn=CONN)
    run = run_dag_file(textwrap.dedent(dag), "rec_path")
    assert run.state == "success"
    ref = recorded_source(_log_uri(conn, "path"))
    assert ref is not None
    assert (ref.kind, ref.uri, ref.format, ref.key_field) == ("path", str(source), "jsonl", "id")
    assert (ref.conn_id, ref.storage_option_names, ref.processor_version, ref.redo_completed) == (
        CONN,
        ("token",),
        "v3",
        "never",
    )
    assert (ref.items, ref.log_version, ref.uri_redacted) == (6, 0, False)  # planned before anything ran
    _no_secret_in(source_ref_uri(_log_uri(conn, "path")))


def test_an_inline_source_is_recorded_as_its_snapshot_even_with_nothing_pending(
    run_dag_file: Callable[..., Any], conn: Path
) -> None:
    dag = DAG.format(dag_id="rec_inline", experiment="inline", source=_items(5), conn=CONN)
    assert run_dag_file(textwrap.dedent(dag), "rec_inline").state == "success"
    first = recorded_source(_log_uri(conn, "inline"))
    assert first is not None and first.kind == "inline" and first.format == "snapshot"
    snapshots = f"{experiment_uri(_log_uri(conn, 'inline'))}/{SNAPSHOTS_DIR}/"
    assert first.uri.startswith(snapshots) and first.items == 5
    # run again: nothing is pending, no chunk names the snapshot, and the record still does
    again = run_dag_file(textwrap.dedent(dag), "rec_inline")
    assert again.state == "success" and again.xcom("plan") == []
    second = recorded_source(_log_uri(conn, "inline"))
    assert second is not None and second.uri == first.uri and second.log_version > first.log_version
