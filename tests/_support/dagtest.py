"""Run a DAG file in-process with ``dag.test()`` and read back what it did; clear and rerun a run.

What works in Airflow 3.3 (read from airflow/sdk/definitions/dag.py, ``DAG.test``):

* ``dag.test()`` always makes a *new* run. It first clears every task instance at its logical date
  (``SerializedDAG.clear_dags``) and ``get_or_create_dagrun`` then *deletes* any run at that logical
  date and creates a fresh one. There is no ``run_id=`` argument, so calling ``dag.test()`` again
  reruns every task, not just the failed one.
* To rerun only a cleared task instance, :meth:`DagTestRun.clear_and_rerun` clears it with
  ``SerializedDAG.clear(task_ids=[...], run_id=...)`` (what the REST ``clearTaskInstances`` does;
  ``(task_id, map_index)`` pairs clear one mapped instance) and then calls ``dag.test()`` with two of
  its internals patched: ``clear_dags`` becomes a no-op and ``get_or_create_dagrun`` returns the
  existing run, set back to RUNNING. ``dag.test()``'s own scheduling loop then runs exactly the
  task instances that are not finished, with ``try_number`` incremented as the scheduler would.
  This relies on two private names; if a later Airflow renames them, the patch raises
  ``AttributeError`` instead of silently rerunning everything.
* A failed task's own exception: ``dag.test()`` keeps only the state. It runs every task in this
  process through ``supervisor.run_task_in_process``, whose ``TaskRunResult.error`` is the exception
  the task ended with (the one ``on_failure_callback`` gets as ``context["exception"]``). The harness
  wraps that function while ``dag.test()`` runs and records the latest attempt's error per
  ``(task_id, map_index)``: :meth:`DagTestRun.error` returns it and :meth:`DagTestRun.assert_failed`
  checks a failure's type and message, so a test asserts the cause, not just ``state == "failed"``.
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.sdk import DAG

_DAG_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

TaskKey = tuple[str, int]
"""``(task_id, map_index)``; ``map_index`` is ``-1`` for an unmapped task."""


def write_dag_file(src: str | os.PathLike[str], dag_id: str, dags_folder: Path) -> Path:
    """Copy a DAG file (a path, or its source text) into the DAGs folder as ``<dag_id>.py``."""
    if not _DAG_ID_RE.match(dag_id):
        raise ValueError(f"dag_id {dag_id!r} is not usable as a file name")
    target = dags_folder / f"{dag_id}.py"
    is_path = isinstance(src, os.PathLike) or ("\n" not in src and Path(src).is_file())
    if is_path:
        shutil.copyfile(src, target)
    else:
        target.write_text(str(src))
    return target


def load_dag(path: Path, dag_id: str) -> DAG:
    """Parse one DAG file the way the dag-processor does; fail with the import error if any."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(path), safe_mode=False, bundle_path=path.parent, bundle_name="dags-folder")
    if bag.import_errors:
        raise AssertionError(f"DAG file {path} failed to import:\n" + "\n".join(bag.import_errors.values()))
    if dag_id not in bag.dags:
        raise AssertionError(f"DAG file {path} defines {sorted(bag.dags)}, not {dag_id!r}")
    return bag.dags[dag_id]


def run_dag_file(
    src: str | os.PathLike[str], dag_id: str, *, dags_folder: Path, conf: dict[str, Any] | None = None
) -> DagTestRun:
    """Write the DAG file into ``dags_folder``, parse it and run it once with ``dag.test()``."""
    path = write_dag_file(src, dag_id, dags_folder)
    dag = load_dag(path, dag_id)
    errors: dict[TaskKey, BaseException | None] = {}
    with recording_task_errors(errors):
        dag_run = dag.test(run_conf=conf)
    return DagTestRun(dag=dag, dag_run=dag_run, task_errors=errors)


@contextmanager
def recording_task_errors(errors: dict[TaskKey, BaseException | None]) -> Iterator[None]:
    """While inside, record into ``errors`` the exception each task attempt ends with (``None`` if none).

    Every attempt overwrites its key, so after a clear and rerun the entry is the latest attempt's; a
    deferred task's key is written again when it resumes. An exception raised by the in-process run
    itself (not by the task) is recorded too, then re-raised to ``dag.test()`` as before.
    """
    # Airflow is imported only after tests/conftest.py has set up its environment.
    from airflow.sdk.execution_time import supervisor

    real = supervisor.run_task_in_process

    def run_and_record(ti: Any, task: Any, client: Any = None) -> Any:
        key = (ti.task_id, ti.map_index)
        try:
            result = real(ti=ti, task=task, client=client)
        except BaseException as exc:
            errors[key] = exc
            raise
        errors[key] = result.error
        return result

    with mock.patch.object(supervisor, "run_task_in_process", run_and_record):
        yield


@dataclass
class DagTestRun:
    """One DAG run made by ``dag.test()``; every read goes to the metadata DB, so it is always fresh."""

    dag: DAG
    dag_run: DagRun
    task_errors: dict[TaskKey, BaseException | None] = field(default_factory=dict)

    @property
    def dag_id(self) -> str:
        return self.dag_run.dag_id

    @property
    def run_id(self) -> str:
        return self.dag_run.run_id

    @property
    def state(self) -> str:
        """The run's state now, as a plain string ("success", "failed", ...)."""
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            state = session.scalar(
                select(DagRun.state).where(DagRun.dag_id == self.dag_id, DagRun.run_id == self.run_id)
            )
        return str(getattr(state, "value", state))

    def task_instances(self) -> list[TaskInstance]:
        """All task instances of the run, sorted by (task_id, map_index), detached from any session."""
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            tis = list(
                session.scalars(
                    select(TaskInstance)
                    .where(TaskInstance.dag_id == self.dag_id, TaskInstance.run_id == self.run_id)
                    .order_by(TaskInstance.task_id, TaskInstance.map_index)
                )
            )
            session.expunge_all()
        return tis

    def ti(self, task_id: str, map_index: int = -1) -> TaskInstance:
        """One task instance; ``map_index`` selects a mapped instance."""
        for ti in self.task_instances():
            if ti.task_id == task_id and ti.map_index == map_index:
                return ti
        raise KeyError(f"no task instance {task_id}[{map_index}] in run {self.run_id}")

    def states(self) -> dict[tuple[str, int], str | None]:
        """``{(task_id, map_index): state}`` for a compact assertion."""
        return {(ti.task_id, ti.map_index): _plain(ti.state) for ti in self.task_instances()}

    def error(self, task_id: str, map_index: int = -1) -> BaseException | None:
        """The exception the task instance's latest attempt ended with; ``None`` if it raised none or never ran."""
        return self.task_errors.get((task_id, map_index))

    def assert_failed(
        self, task_id: str, error_type: type[BaseException], match: str | None = None, *, map_index: int = -1
    ) -> BaseException:
        """Assert the task instance failed with its own ``error_type`` whose message matches ``match``.

        ``match`` is searched with :func:`re.search` in ``str(error)``, as ``pytest.raises(match=...)``
        does. Returns the exception for further assertions.
        """
        state = self.states().get((task_id, map_index))
        error = self.error(task_id, map_index)
        where = f"{task_id}[{map_index}] in run {self.run_id}"
        if state != "failed":
            raise AssertionError(f"{where} is {state!r}, not 'failed' (its last error: {error!r})")
        if not isinstance(error, error_type):
            raise AssertionError(f"{where} failed with {error!r}, not a {error_type.__name__}")
        if match is not None and not re.search(match, str(error)):
            raise AssertionError(f"{where}: {match!r} not found in the error message {str(error)!r}")
        return error

    def try_numbers(self) -> dict[tuple[str, int], int]:
        return {(ti.task_id, ti.map_index): ti.try_number for ti in self.task_instances()}

    def xcom(self, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """The deserialized XCom value, or ``KeyError`` when the task pushed none."""
        values = self._xcoms(task_id, key, map_index)
        if map_index not in values:
            raise KeyError(f"no XCom {key!r} for {task_id}[{map_index}] in run {self.run_id}")
        return values[map_index]

    def xcoms(self, task_id: str, key: str = "return_value") -> dict[int, Any]:
        """Every map index's value of one XCom key: ``{map_index: value}`` (``-1`` when unmapped)."""
        return self._xcoms(task_id, key, None)

    def _xcoms(self, task_id: str, key: str, map_index: int | None) -> dict[int, Any]:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            rows = session.scalars(
                XComModel.get_many(
                    run_id=self.run_id,
                    key=key,
                    task_ids=task_id,
                    dag_ids=self.dag_id,
                    map_indexes=map_index,
                )
            ).all()
            return dict(sorted((row.map_index, XComModel.deserialize_value(row)) for row in rows))

    def clear_and_rerun(
        self, task_ids: Iterable[str | tuple[str, int]], *, include_downstream: bool = False
    ) -> DagTestRun:
        """Clear the given task instances of *this* run and run it again in-process (see module doc).

        :param task_ids: task ids, or ``(task_id, map_index)`` pairs for single mapped instances.
        :param include_downstream: also clear what depends on them (as the UI's "Downstream" box and
            REST ``include_downstream`` do); without it a downstream task left ``upstream_failed``
            stays so and the run fails again.
        """
        from airflow.models.dagrun import DagRun
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.models.taskinstance import find_relevant_relatives
        from airflow.serialization.definitions.dag import SerializedDAG
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState
        from sqlalchemy import select

        task_ids = list(task_ids)
        with create_session() as session:
            serialized = SerializedDagModel.get_dag(self.dag_id, session=session)
            if serialized is None:
                raise AssertionError(f"DAG {self.dag_id!r} is not serialized; was it run with dag.test()?")
            if include_downstream:
                # The same expansion the REST clearTaskInstances endpoint does for one run.
                task_ids += find_relevant_relatives(
                    [t for t in task_ids if isinstance(t, str)],
                    [t for t in task_ids if isinstance(t, tuple)],
                    direction="downstream",
                    dag=serialized,
                    run_id=self.run_id,
                    session=session,
                )
                task_ids = list(dict.fromkeys(task_ids))
            cleared = serialized.clear(task_ids=task_ids, run_id=self.run_id, session=session)
        if not cleared:
            raise AssertionError(f"clearing {task_ids} in run {self.run_id} matched no task instance")

        run_id = self.run_id

        def resume_existing_run(*, dag: SerializedDAG, session: Any, **_: Any) -> DagRun:
            dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id))
            # dag.test() loops while the run is RUNNING; clear() left it QUEUED for a scheduler.
            dag_run.state = DagRunState.RUNNING
            dag_run.dag = dag
            session.commit()
            return dag_run

        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(SerializedDAG, "clear_dags", return_value=0))
            stack.enter_context(mock.patch("airflow.models.dagrun.get_or_create_dagrun", resume_existing_run))
            stack.enter_context(recording_task_errors(self.task_errors))
            self.dag_run = self.dag.test()
        return self


def _plain(state: Any) -> str | None:
    return None if state is None else str(getattr(state, "value", state))
