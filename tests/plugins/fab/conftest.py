"""The Airflow API server app with the FAB auth manager: real users, roles and per-Dag permissions.

FAB's tables come from ``airflow db migrate`` (the provider's DB manager runs with it). Users are
made with FAB's own security manager; their tokens are the auth manager's JWTs, resolved back to
the FAB user (and its permissions) from the metadata DB on each request, as in ``airflow api-server``.

This package runs apart from the SimpleAuthManager app of ``tests/plugins``: Airflow keeps one auth
manager per process, so the fixture puts back whichever one was current when it ends.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi import FastAPI

FAB_CONN_ID = "datagen_ui_fab_tests"
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"

#: user -> the (action, resource) pairs of their one role; "DAGs" is FAB's all-Dags resource.
USERS: dict[str, list[tuple[str, str]]] = {
    "reader_a": [("can_read", "DAG:dag_a")],
    "reader_ab": [("can_read", "DAG:dag_a"), ("can_read", "DAG:dag_b")],
    # the task-instance tab also needs FAB's "DAG Runs" and "Task Instances" resources
    "ti_reader_a": [("can_read", "DAG:dag_a"), ("can_read", "DAG Runs"), ("can_read", "Task Instances")],
    "all_reader": [("can_read", "DAGs")],
    # may read pools only: authenticated, but no Dag at all
    "no_dags": [("can_read", "Pools")],
}


@pytest.fixture(scope="package")
def fab_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datagen_ui_fab_root")


@pytest.fixture(scope="package")
def fab_app(airflow_db: Path, fab_root: Path) -> Iterator[FastAPI]:
    from airflow.api_fastapi import app as api_app

    from airflow_provider_datagen.plugins.data import reset_reader

    previous = api_app._AuthManagerState.instance
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", FAB)
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "datagen-ui-fab-tests-" + "k" * 43)
        mp.setenv("AIRFLOW__DATAGEN__UI_CONN_ID", FAB_CONN_ID)
        mp.setenv(f"AIRFLOW_CONN_{FAB_CONN_ID.upper()}", json.dumps({"conn_type": "datagen", "host": str(fab_root)}))
        reset_reader()
        api_app.purge_cached_app()
        app = api_app.create_app()
        yield app
        reset_reader()
        api_app.purge_cached_app()
    api_app._AuthManagerState.instance = previous


@pytest.fixture(scope="package")
def fab_tokens(fab_app: FastAPI) -> dict[str, str]:
    """A JWT per user of :data:`USERS` (and ``admin``, FAB's own Admin role), made once."""
    from airflow.api_fastapi.app import get_auth_manager

    am: Any = get_auth_manager()
    tokens = {}
    with am.flask_app.app_context():
        sm = am.security_manager
        for name, perms in USERS.items():
            role = sm.find_role(name) or sm.add_role(name)
            for action, resource in perms:
                sm.add_permission_to_role(role, sm.create_permission(action, resource))
            user = sm.find_user(username=name) or sm.add_user(name, name, "user", f"{name}@example.org", [role], "pw")
            tokens[name] = am.generate_jwt(user)
        admin_role = sm.find_role("Admin")
        assert admin_role is not None, "FAB did not sync its default roles (Admin)"
        admin = sm.find_user(username="admin") or sm.add_user(
            "admin", "admin", "user", "admin@example.org", [admin_role], "pw"
        )
        tokens["admin"] = am.generate_jwt(admin)
    return tokens
