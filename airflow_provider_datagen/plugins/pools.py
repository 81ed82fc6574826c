"""Refuse a DAG run whose datagen task asks for more pool slots than its pool has (a scheduler listener).

Airflow 3.3 leaves such a task instance scheduled forever: at each loop the scheduler logs "Requested
pool slots (N) are greater than total pool slots" and starves it (a pool that does not exist: "Tasks
using non-existent pool ... will not be scheduled"), and the run never ends. A datagen run is the
worst case: the plan task succeeds and then every chunk waits.

Where the check can happen: DAG parsing and task code run in subprocesses whose ORM Airflow blocks,
and neither the Task SDK nor the execution API has a pool call, so neither an operator's
``__init__`` nor the plan task can read a pool's size. The first point that knows both the tasks and
the pools is the scheduler starting the run (``on_dag_run_running`` with ``msg="started"``), before
any task of the run is queued. There this listener, registered by the datagen plugin, checks every
datagen task of the DAG and, when one cannot ever run, fails the run at once and writes the error (a
:class:`~airflow_provider_datagen.exceptions.ConfigurationError` naming the task, pool, slots and
fix) as the run's note, shown on the run in the UI, and in the scheduler's log. See
docs/adr/0017-refuse-pool-slots-above-pool-size.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pluggy

from airflow_provider_datagen.exceptions import ConfigurationError, bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

# The marker Airflow's listener manager collects (``airflow.listeners.hookimpl`` is this very marker);
# made here so that loading the plugin on a worker imports nothing of the scheduler's.
hookimpl = pluggy.HookimplMarker("airflow")

_PACKAGE = "airflow_provider_datagen."


def is_datagen_task(task: Any) -> bool:
    """Whether a (serialized) task is one of the provider's operators."""
    module = getattr(task, "_task_module", None) or type(task).__module__
    return str(module).startswith(_PACKAGE)


def pool_slots_errors(tasks: Iterable[Any], pool_size: Callable[[str], int | None]) -> list[ConfigurationError]:
    """The errors of the datagen ``tasks`` that no pool can ever run.

    :param tasks: tasks with ``task_id``, ``pool`` and ``pool_slots`` (mapped ones included).
    :param pool_size: a pool's total slots, or None when there is no such pool (``-1``: unlimited).
    """
    errors = []
    for task in tasks:
        if not is_datagen_task(task):
            continue
        pool, slots = str(task.pool), int(task.pool_slots)
        size = pool_size(pool)
        owner = f"{getattr(task, 'task_type', None) or type(task).__name__}(task_id={task.task_id!r})"
        if size is None:
            errors.append(
                bad_argument(
                    owner,
                    "pool",
                    pool,
                    "names a pool that does not exist, so Airflow would never schedule the task",
                    f"create the pool with at least {slots} slot(s) (Admin > Pools, or `airflow pools set "
                    f"{pool} {slots} ''`) or name an existing pool",
                )
            )
        elif 0 <= size < slots:
            errors.append(
                bad_argument(
                    owner,
                    "pool_slots",
                    slots,
                    f"is more than pool {pool!r} has ({size} slot(s)), so Airflow would never schedule the task",
                    f"give pool_slots <= {size}, or raise the pool's size to at least {slots} "
                    f"(`airflow pools set {pool} {slots} ''`)",
                )
            )
    return errors


def _pool_size(session: Any) -> Callable[[str], int | None]:
    # Deferred: only the scheduler calls the listener, and it has the metadata DB.
    from airflow.models.pool import Pool
    from sqlalchemy import select

    def size(name: str) -> int | None:
        slots = session.scalar(select(Pool.slots).where(Pool.pool == name))
        return None if slots is None else int(slots)

    return size


class PoolSlotsCheck:
    """The listener: fails a starting run that has a datagen task no pool can run."""

    @hookimpl
    def on_dag_run_running(self, dag_run: Any, msg: str) -> None:
        if msg != "started":
            return
        dag = getattr(dag_run, "dag", None)
        if dag is None:
            return
        from sqlalchemy.orm import object_session

        session = object_session(dag_run)
        if session is not None:
            refuse_unrunnable(dag_run, dag, session)


def refuse_unrunnable(dag_run: Any, dag: Any, session: Any) -> list[ConfigurationError]:
    """Fail ``dag_run`` (in ``session``, committed by the scheduler) if a datagen task of ``dag`` can never run.

    Returns the errors (empty: the run is left alone). The run's note says why, for the UI.
    """
    errors = pool_slots_errors(dag.tasks, _pool_size(session))
    if errors:
        text = "; ".join(str(e) for e in errors)
        logger.error("datagen: failing run %s of %s: %s", dag_run.run_id, dag_run.dag_id, text)
        from airflow.utils.state import DagRunState

        dag_run.set_state(DagRunState.FAILED)
        dag_run.note = f"Refused by the datagen provider before any task ran: {text}"[:1000]
    return errors
