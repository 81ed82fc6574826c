"""The Airflow API server app (with the datagen plugin mounted from its entry point) and its auth.

The app is Airflow's own ``create_app()``, so every request goes through the same auth managers,
middlewares and mounts as in ``airflow api-server``. Tokens are real SimpleAuthManager JWTs: minted
through ``POST /auth/token`` with a generated password (what the login page does) or with the auth
manager's ``generate_jwt`` for roles the login cannot produce.

The UI reads the root of a connection of its own (``[datagen] ui_conn_id``) so no other test's
``datagen_default`` is touched.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

UI_CONN_ID = "datagen_ui_tests"
USERS = "admin:admin,viewer:viewer"


@pytest.fixture(scope="package")
def ui_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datagen_ui_root")


@pytest.fixture(scope="package")
def airflow_app(airflow_db: Path, ui_root: Path) -> Iterator[FastAPI]:
    # Airflow reads AIRFLOW__* variables at each conf lookup, so setting them here is enough; they are
    # restored when the session ends.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "AIRFLOW__CORE__AUTH_MANAGER",
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        )
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", USERS)
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        # A 64-byte key: the generated default is shorter than RFC 7518 recommends for HS512 and PyJWT
        # warns on every token.
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "datagen-ui-tests-" + "k" * 47)
        mp.setenv("AIRFLOW__DATAGEN__UI_CONN_ID", UI_CONN_ID)
        mp.setenv(
            f"AIRFLOW_CONN_{UI_CONN_ID.upper()}",
            json.dumps({"conn_type": "datagen", "host": str(ui_root)}),
        )
        from airflow.api_fastapi.app import create_app, purge_cached_app

        from airflow_provider_datagen.plugins.data import reset_reader

        reset_reader()
        app = create_app()
        yield app
        reset_reader()
        purge_cached_app()


@pytest.fixture(scope="package")
def passwords(airflow_app: FastAPI) -> dict[str, str]:
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    with open(SimpleAuthManager.get_generated_password_file()) as f:
        return json.load(f)


@pytest.fixture
def anon(airflow_app: FastAPI) -> TestClient:
    """A client with no credentials at all."""
    from fastapi.testclient import TestClient

    return TestClient(airflow_app)


@pytest.fixture(scope="package")
def admin_token(airflow_app: FastAPI, passwords: dict[str, str]) -> str:
    from fastapi.testclient import TestClient

    r = TestClient(airflow_app).post("/auth/token", json={"username": "admin", "password": passwords["admin"]})
    assert r.status_code == 201, r.text
    return r.json()["access_token"]


@pytest.fixture
def client(airflow_app: FastAPI, admin_token: str) -> TestClient:
    """An admin client authenticated like the Airflow UI: the ``_token`` session cookie."""
    from fastapi.testclient import TestClient

    c = TestClient(airflow_app)
    c.cookies.set("_token", admin_token)
    return c


@pytest.fixture(scope="package")
def ui_log(ui_root: Path):
    """Open (create lazily) an experiment's log under the UI's root."""
    from airflow_provider_datagen.core import CheckpointLog

    def _open(pipeline: str, experiment: str) -> Any:
        return CheckpointLog.open(str(ui_root), pipeline=pipeline, experiment=experiment)

    return _open
