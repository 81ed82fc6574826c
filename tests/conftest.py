"""Session-wide test set-up: a private AIRFLOW_HOME, an on-demand metadata DB, and ``run_dag_file``.

Airflow reads its configuration once, when ``airflow`` is first imported, so the environment is
set here at import time, before any test module can import it. Unit tests never touch the DB: the
``airflow db migrate`` (about 5 s) runs only when a collected test asks for ``airflow_db``
(directly or through ``run_dag_file``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests._support import profiles

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_datagen.core import CheckpointLog
    from tests._support.dagtest import DagTestRun

# A developer's own Airflow settings (a real AIRFLOW_HOME, connections, a Postgres URL) must not leak
# into the tests, and tests must never write into them.
for _key in list(os.environ):
    if _key.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")) or _key in {
        "AIRFLOW_HOME",
        "AIRFLOW_CONFIG",
    }:
        del os.environ[_key]

SESSION_TMP = Path(tempfile.mkdtemp(prefix="datagen-tests-"))
AIRFLOW_HOME = SESSION_TMP / "airflow_home"
DAGS_FOLDER = AIRFLOW_HOME / "dags"
DAGS_FOLDER.mkdir(parents=True)

os.environ.update(
    {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # unit_test_mode would load Airflow's own unit_tests.cfg, written for Airflow's repository
        # (its tests/dags folder, example DAGs on, FAB auth backend); nothing in it helps here.
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # dag.test() runs each task in a forked child; a short grace keeps failures fast.
        "AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME": "5",
    }
)


# `make unit` (the inner loop) runs the "quick" Hypothesis profile, `make test` "full"; loaded before any test
# module is imported, so each module's @settings inherit it. A test that wants more examples than the
# default asks for them through tests._support.profiles.examples(n), which the quick profile caps.
profiles.load()


class _WorkerSummaryLines:
    """Prints the ``summary_lines`` xdist workers hand back (see test_hostile_input.py's tally).

    Under ``make unit``'s xdist a plugin registered by a test module lives in a worker, whose terminal summary
    is dropped; the worker puts its lines in ``config.workeroutput`` and the controller prints them here.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        worker = node.workerinput.get("workerid", "?")
        self.lines += [f"[{worker}] {line}" for line in node.workeroutput.get("summary_lines", [])]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.lines:
            terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)  # after xdist's own pytest_configure has registered its dsession
def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("dsession"):  # the xdist controller (a worker has no dsession)
        config.pluginmanager.register(_WorkerSummaryLines(), "datagen-worker-summary-lines")


def pytest_unconfigure(config: pytest.Config) -> None:
    # Keep the home for post-mortems when asked; it holds the DB and every task log.
    if os.environ.get("DATAGEN_KEEP_TEST_HOME") == "1":
        sys.stderr.write(f"\nAirflow test home kept at {SESSION_TMP}\n")
        return
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Migrate the session's SQLite metadata DB once; return AIRFLOW_HOME.

    A subprocess runs the migration so this pytest process does not configure Airflow's logging and
    ORM in the CLI's way; the in-process ORM connects lazily and sees the migrated file.
    """
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"airflow db migrate failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return AIRFLOW_HOME


@pytest.fixture(scope="session")
def dags_folder() -> Path:
    """The session's ``[core] dags_folder``; ``dag.test()`` needs the DAG file to sit inside it."""
    return DAGS_FOLDER


@pytest.fixture
def run_dag_file(airflow_db: Path) -> Iterator[Callable[..., DagTestRun]]:
    """Return ``run(src, dag_id, **conf) -> DagTestRun``: copy a DAG file in, run it with ``dag.test()``.

    ``src`` is a path to a DAG file or the file's source text. The result wraps the ``DagRun``
    (``.dag_run``) and reads its task instances and XComs back from the DB; ``.clear_and_rerun(...)``
    clears chosen task instances and runs the same DAG run again in-process. See tests/_support/dagtest.py.
    """
    from tests._support.dagtest import run_dag_file as run

    def _run(src: str | os.PathLike[str], dag_id: str, **conf: object) -> DagTestRun:
        return run(src, dag_id, dags_folder=DAGS_FOLDER, conf=conf or None)

    yield _run


@pytest.fixture
def checkpoint_log(tmp_path: Path) -> Callable[..., CheckpointLog]:
    """Return ``open(experiment="e", *, pipeline="p", root=tmp_path, **options) -> CheckpointLog``.

    Opens (without creating) the experiment's log under the test's own directory by default; ``options``
    go to ``CheckpointLog.open`` as given (``blob_threshold=``, ``remember_fold=``, ``storage_options=``, ...).
    Every call opens a fresh handle, as a second task would, so reopening the same experiment reads it anew.
    """
    from tests._support.engine import open_log

    def _open(
        experiment: str = "e", *, pipeline: str = "p", root: str | os.PathLike[str] | None = None, **options: Any
    ) -> CheckpointLog:
        return open_log(tmp_path if root is None else root, experiment, pipeline, **options)

    return _open
