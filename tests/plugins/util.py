"""Helpers shared by the plugin tests: JWTs for any role, Airflow coordinates, page parsing."""

from __future__ import annotations

import html
import re
from typing import Any


def mint(username: str, role: str | None, **kwargs: Any) -> str:
    """A JWT signed by the running auth manager, for any role (including none)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=username, role=role), **kwargs)


def airflow_coords(
    dag_id: str = "dg", run_id: str = "run1", task_id: str = "map", map_index: int = 0, try_number: int = 1
) -> dict[str, Any]:
    return {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index, "try_number": try_number}


def card(page: str, label: str) -> int:
    """The number on an experiment page's summary card ``label``."""
    m = re.search(r"<span class='muted'>" + re.escape(label) + r"</span><b>([\d,]+)</b>", page)
    assert m, f"no card {label!r} on the page"
    return int(m.group(1).replace(",", ""))


def escaped(text: str) -> str:
    return html.escape(text, quote=True)
