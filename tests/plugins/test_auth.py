"""Every plugin route sits behind Airflow's own auth: 401 without a token, 200 with the UI session."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest

from tests.plugins.util import airflow_coords, mint

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

ROUTES = [
    "/datagen/",
    "/datagen/api/experiments",
    "/datagen/experiments/auth/e1",
    "/datagen/api/experiments/auth/e1",
    "/datagen/api/experiments/auth/e1/items",
    "/datagen/experiments/auth/e1/item?id=a",
    "/datagen/api/experiments/auth/e1/item?id=a",
    "/datagen/ti/dg/run1/map/0",
    "/datagen/api/ti/dg/run1/map/0",
]


@pytest.fixture(scope="module", autouse=True)
def auth_log(ui_log) -> None:
    lg = ui_log("auth", "e1")
    w = lg.writer("w1", 1, airflow=airflow_coords())
    with w.batch() as b:
        b.item_created("a", input_fingerprint="f1")
        b.field_set("a", "blob", b"\x01" * 40_000)


def _blob_route(client: TestClient) -> str:
    item = client.get("/datagen/api/experiments/auth/e1/item?id=a").json()
    return item["fields"]["blob"]["blob"]["url"]


@pytest.mark.parametrize("route", ROUTES)
def test_no_token_is_401(anon: TestClient, route: str) -> None:
    r = anon.get(route)
    assert r.status_code == 401, r.text
    assert r.json() == {"detail": "Not authenticated"}


def test_blob_without_token_is_401(anon: TestClient, client: TestClient) -> None:
    route = _blob_route(client)
    assert client.get(route).status_code == 200
    assert anon.get(route).status_code == 401


@pytest.mark.parametrize("route", ROUTES)
def test_ui_session_cookie_is_200(client: TestClient, route: str) -> None:
    # `client` carries the `_token` cookie the login page sets from POST /auth/token: the same
    # credential the browser sends to the iframe tab.
    assert client.get(route).status_code == 200


@pytest.mark.parametrize("route", ROUTES[:3] + ROUTES[-2:])
def test_bearer_token_is_200(anon: TestClient, admin_token: str, route: str) -> None:
    assert anon.get(route, headers={"Authorization": f"Bearer {admin_token}"}).status_code == 200


def test_viewer_role_can_read(anon: TestClient) -> None:
    token = mint("viewer", "viewer")
    for route in ("/datagen/", "/datagen/ti/dg/run1/map/0"):
        assert anon.get(route, headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_authenticated_but_unauthorized_is_403(anon: TestClient) -> None:
    # A valid JWT whose user has no role: authentication passes, requires_access_dag refuses.
    token = mint("nobody", None)
    for route in ("/datagen/", "/datagen/api/experiments/auth/e1", "/datagen/api/ti/dg/run1/map/0"):
        r = anon.get(route, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403, (route, r.text)


def test_bad_and_expired_tokens(anon: TestClient) -> None:
    assert anon.get("/datagen/", headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    expired = mint("admin", "admin", expiration_time_in_seconds=-60)
    assert anon.get("/datagen/", headers={"Authorization": f"Bearer {expired}"}).status_code == 401


def test_dag_id_query_cannot_narrow_the_check(client: TestClient) -> None:
    # requires_access_dag reads dag_id from the query string when the path has none; on the
    # experiment routes that would turn "may read Dags" into "may read this one Dag".
    r = client.get("/datagen/api/experiments/auth/e1?dag_id=dg")
    assert r.status_code == 400
    assert "dag_id" in r.json()["detail"]


def test_no_unauthenticated_docs(anon: TestClient) -> None:
    for route in ("/datagen/docs", "/datagen/openapi.json", "/datagen/redoc"):
        assert anon.get(route).status_code in (401, 404)


def test_plugin_loaded_from_entry_point(airflow_app) -> None:
    from airflow import plugins_manager
    from fastapi.routing import Mount

    plugins = {p.name: p for p in plugins_manager._get_plugins()[0]}
    plugin = plugins["datagen"]
    assert "airflow.plugins" in str(plugin.source) or "datagen" in str(plugin.source)
    assert type(plugin.source).__name__ == "EntryPointSource"
    assert [a["url_prefix"] for a in plugin.fastapi_apps] == ["/datagen"]
    views = {v["destination"]: v for v in plugin.external_views}
    assert views["nav"]["name"] == "Datagen" and views["nav"]["url_route"]
    ti = views["task_instance"]
    assert ti["url_route"] and ti["href"] == "datagen/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}"
    assert any(isinstance(r, Mount) and r.path == "/datagen" for r in airflow_app.routes)
    # The plugins API the UI reads lists both views with the shape it validates.
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    for v in plugin.external_views:
        ExternalViewResponse.model_validate(v)


def test_plugin_module_is_light() -> None:
    # Workers import every plugin (for macros): the plugin module must not drag in the API server,
    # FastAPI or Lance; only the API server, reading `fastapi_apps`, builds the app.
    import subprocess

    code = (
        "import sys; import airflow_provider_datagen.plugins.datagen as m; "
        "heavy = [n for n in ('lance', 'fastapi', 'airflow.api_fastapi.core_api.security') if n in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
