"""Per-Dag access to experiments: which experiments a user may see, asked of Airflow's auth manager.

An experiment belongs to the Dags that wrote it: every event a datagen task writes carries its
``dag_id`` (the same Dag the writer id ``<dag_id>/<run_id>/<task_id>/<map_index>`` names). A user
sees an experiment when the auth manager says they may read **every** Dag that wrote it (an
experiment two Dags wrote holds both Dags' data, so reading one of them is not enough). Events
written outside any Dag (``run_items`` in a script, a notebook) have no ``dag_id``; an experiment
holding any is shown only to users who may read all Dags.

"May read all Dags" is asked as a question about a Dag id no Dag can have: auth managers answer
``is_authorized_dag`` without an id as "may list Dags" (FAB says yes to a user with a single
``can_read`` on ``DAG:<id>``), so that call cannot tell an all-Dag reader from a one-Dag reader.
Dag ids match ``[A-Za-z0-9_.-]+``, so no per-Dag grant names :data:`ANY_DAG_PROBE`; only a grant
over all Dags (FAB's ``can_read`` on ``DAGs``, SimpleAuthManager's viewer role) authorizes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager

#: A Dag id no Dag can have (":" and spaces are not allowed in Dag ids): authorized only by a grant
#: over all Dags.
ANY_DAG_PROBE = "datagen: any Dag"


@dataclass(frozen=True)
class Writers:
    """The Dags whose tasks wrote an experiment, and whether anything wrote outside any Dag."""

    dag_ids: frozenset[str]
    outside: bool


@dataclass
class DagAccess:
    """One request's view of what its user may read; each answer is asked of the auth manager once."""

    user: Any
    auth_manager: BaseAuthManager
    _dags: dict[str, bool] = field(default_factory=dict)
    _all: bool | None = None

    @classmethod
    def for_user(cls, user: Any) -> DagAccess:
        # Deferred: the API server's auth manager exists only where the plugin app runs.
        from airflow.api_fastapi.app import get_auth_manager

        return cls(user, get_auth_manager())

    def may_list(self) -> bool:
        """Whether the user may read any Dag at all (the pages' entry condition)."""
        return self.auth_manager.is_authorized_dag(method="GET", user=self.user)

    def all_dags(self) -> bool:
        """Whether the user may read every Dag, including ones no per-Dag grant names."""
        if self._all is None:
            self._all = self._ask([ANY_DAG_PROBE])[ANY_DAG_PROBE]
        return self._all

    def _ask(self, dag_ids: Iterable[str]) -> dict[str, bool]:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

        out = {}
        for dag_id in dag_ids:
            if dag_id not in self._dags:
                self._dags[dag_id] = self.auth_manager.is_authorized_dag(
                    method="GET", details=DagDetails(id=dag_id, team_name=_team_name(dag_id)), user=self.user
                )
            out[dag_id] = self._dags[dag_id]
        return out

    def may_read(self, writers: Writers) -> bool:
        """Whether the user may see an experiment written by ``writers``."""
        if self.all_dags():
            return True
        if writers.outside or not writers.dag_ids:
            # Written outside any Dag (or nothing attributable): only all-Dag readers see it.
            return False
        return all(self._ask(sorted(writers.dag_ids)).values())


def _team_name(dag_id: str) -> str | None:
    """The Dag's team in a multi-team deployment (None otherwise, without a DB query)."""
    from airflow.configuration import conf

    if dag_id == ANY_DAG_PROBE or not conf.getboolean("core", "multi_team", fallback=False):
        return None
    from airflow.models.dag import DagModel

    return DagModel.get_team_name(dag_id)
