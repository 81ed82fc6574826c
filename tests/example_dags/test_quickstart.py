"""The quickstart example DAG through dag.test(): transient errors retried in place; others fail, clear, rerun."""

from __future__ import annotations

import collections
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import airflow_provider_datagen.example_dags as example_dags
from airflow_provider_datagen.example_dags.fakes import flaky_on_first_attempt, prompts
from airflow_provider_datagen.operators.datagen import ItemsFailedError

if TYPE_CHECKING:
    from collections.abc import Callable

QUICKSTART = Path(example_dags.__file__).parent / "datagen_quickstart.py"


def _invocations(path: Path) -> collections.Counter[str]:
    if not path.exists():
        return collections.Counter()
    return collections.Counter(line.split("\t")[0] for line in path.read_text().splitlines() if line)


@pytest.fixture
def quickstart_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The quickstart over 60 items with a counted process whose first-attempt errors are not retryable."""
    calls = tmp_path / "calls.tsv"
    monkeypatch.setenv("DATAGEN_TEST_CALLS", str(calls))
    monkeypatch.setenv("DATAGEN_QUICKSTART_PROCESS", "tests._support.procs:counted_refusing_fake_model")
    monkeypatch.setenv("DATAGEN_QUICKSTART_EXPERIMENT", f"t{os.getpid()}{tmp_path.name[-6:]}".replace("_", ""))
    monkeypatch.setenv("DATAGEN_QUICKSTART_ITEMS", "60")
    monkeypatch.setenv("DATAGEN_QUICKSTART_CHUNK", "20")
    monkeypatch.setenv("DATAGEN_EXPORT_DIR", str(tmp_path / "exports"))
    return calls


def test_quickstart_clear_and_rerun_touches_only_failed_items(
    run_dag_file: Callable[..., object], quickstart_env: Path
) -> None:
    run = run_dag_file(QUICKSTART, "datagen_quickstart")
    states = run.states()  # type: ignore[attr-defined]
    flaky = {p["id"] for p in prompts(60) if flaky_on_first_attempt(p["id"])}
    assert flaky, "the fixture must contain flaky items"
    assert run.state == "failed"  # type: ignore[attr-defined]
    failed_idx = [mi for (tid, mi), st in states.items() if tid == "generate" and st == "failed"]
    assert failed_idx
    # each failed chunk names its failed items and the first one's own error; together they are the flaky ones
    named: set[str] = set()
    for mi in failed_idx:
        cause = r"items failed in this chunk: .*\(first error: ModelRequestError: model refused the request"
        error = run.assert_failed("generate", ItemsFailedError, cause, map_index=mi)  # type: ignore[attr-defined]
        named |= set(re.findall(r"'([^']+)'", str(error).split(" (first error:")[0]))
    assert named == flaky
    first = _invocations(quickstart_env)
    assert set(first) == {p["id"] for p in prompts(60)}
    assert all(n == 1 for n in first.values())
    quickstart_env.unlink()

    run.clear_and_rerun([("generate", mi) for mi in failed_idx], include_downstream=True)  # type: ignore[attr-defined]
    assert run.state == "success"  # type: ignore[attr-defined]
    second = _invocations(quickstart_env)
    assert set(second) == flaky
    assert all(n == 1 for n in second.values())
    export = run.xcom("export")  # type: ignore[attr-defined]
    assert export["rows"] == 60
    status = run.xcom("export", key="datagen_status")  # type: ignore[attr-defined]
    assert status["completed"] == 60 and status["pending"] == 0


def test_quickstart_retries_its_transient_errors_and_succeeds_in_one_run(
    run_dag_file: Callable[..., object], quickstart_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_datagen.core import key_of
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    monkeypatch.setenv("DATAGEN_QUICKSTART_PROCESS", "tests._support.procs:counted_fake_model")
    run = run_dag_file(QUICKSTART, "datagen_quickstart")
    assert run.state == "success"  # type: ignore[attr-defined]
    flaky = {p["id"] for p in prompts(60) if flaky_on_first_attempt(p["id"])}
    calls = _invocations(quickstart_env)
    assert calls == collections.Counter({p["id"]: 2 if p["id"] in flaky else 1 for p in prompts(60)})
    assert all(n == 1 for n in run.try_numbers().values())  # type: ignore[attr-defined]
    log = DatagenHook().get_log("quickstart", os.environ["DATAGEN_QUICKSTART_EXPERIMENT"])
    failures = log.failures()
    assert sorted(key_of(f.item_id) for f in failures) == sorted(flaky)  # one transient row per flaky item
    assert all(f.transient and f.attempt == 1 and f.error_type == "TransientModelError" for f in failures)
    status = run.xcom("export", key="datagen_status")  # type: ignore[attr-defined]
    assert status["completed"] == 60 and status["failed_items"] == 0
