"""A client for a real Airflow stack on 127.0.0.1, driven only through the public REST API.

The processes are started and stopped by :mod:`dev.stack` (shared with ``make airflow`` and
``make demo``); this module adds what a test needs on top: a JWT, REST helpers, and waits.
"""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

import httpx

from dev.processes import StackError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from dev.stack import AirflowStack

TERMINAL_RUN_STATES = frozenset({"success", "failed"})


class AirflowClient:
    """REST helpers bound to one running :class:`AirflowStack`.

    :param stack: a started, healthy stack.
    """

    def __init__(self, stack: AirflowStack) -> None:
        self.stack = stack
        self.base_url = stack.settings.base_url
        self.dags_folder: Path = stack.settings.dags_folder
        self.username = stack.settings.username
        self.password = stack.settings.password
        self._token: str | None = None
        self._token_at = 0.0
        self._http = httpx.Client(base_url=self.base_url, timeout=30.0)

    def close(self) -> None:
        self._http.close()

    # -- auth and raw verbs -------------------------------------------------------------------------

    def token(self) -> str:
        """A JWT for the admin user from SimpleAuthManager's ``POST /auth/token`` (cached 10 min)."""
        if self._token is None or time.monotonic() - self._token_at > 600:
            response = self._http.post("/auth/token", json={"username": self.username, "password": self.password})
            response.raise_for_status()
            self._token = response.json()["access_token"]
            self._token_at = time.monotonic()
        return self._token

    def request(self, method: str, path: str, *, expect: Iterable[int] = (200,), **kwargs: Any) -> Any:
        """Send an authenticated request to ``/api/v2`` + ``path``; return the decoded JSON body."""
        url = path if path.startswith(("/api/", "/auth/")) else f"/api/v2{path}"
        headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
        response = self._http.request(method, url, headers=headers, **kwargs)
        if response.status_code not in tuple(expect):
            raise AssertionError(
                f"{method} {url} -> {response.status_code}, expected {tuple(expect)}: {response.text[:2000]}"
            )
        return response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=json, **kwargs)

    def patch(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.request("PATCH", path, json=json, **kwargs)

    # -- DAGs ---------------------------------------------------------------------------------------

    def add_dag_file(self, src: Path | str, name: str) -> Path:
        """Put a DAG file (a path or source text) into the stack's DAGs folder as ``name``."""
        target = self.dags_folder / name
        if isinstance(src, str) and "\n" in src:
            target.write_text(src)
        else:
            shutil.copyfile(src, target)
        return target

    def wait_dag_parsed(self, dag_id: str, timeout: float = 60.0) -> dict:
        """Wait until the dag-processor has serialized ``dag_id``; fail early on an import error."""
        deadline = time.monotonic() + timeout
        while True:
            response = self._http.get(f"/api/v2/dags/{dag_id}", headers={"Authorization": f"Bearer {self.token()}"})
            if response.status_code == 200:
                return response.json()
            errors = self.get("/importErrors", params={"limit": 100})["import_errors"]
            if errors:
                raise AssertionError(f"DAG import errors while waiting for {dag_id}: {errors}")
            if time.monotonic() > deadline:
                self.stack.check_alive()
                raise AssertionError(f"DAG {dag_id} was not parsed within {timeout:.0f} s")
            time.sleep(0.5)

    def unpause(self, dag_id: str) -> None:
        self.patch(f"/dags/{dag_id}", json={"is_paused": False}, params={"update_mask": "is_paused"})

    # -- runs ---------------------------------------------------------------------------------------

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """Trigger a manual run (no logical date) and return its run id."""
        body = {"logical_date": None, "conf": conf or {}}
        return self.post(f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 60.0) -> str:
        """Wait for the run to reach success or failed; return that state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.run_state(dag_id, run_id)
            if state in TERMINAL_RUN_STATES:
                return state
            if time.monotonic() > deadline:
                self.stack.check_alive()
                raise AssertionError(
                    f"run {dag_id}/{run_id} still {state} after {timeout:.0f} s; task instances: "
                    f"{[(t['task_id'], t['map_index'], t['state']) for t in self.task_instances(dag_id, run_id)]}"
                )
            time.sleep(0.5)

    def wait_success(self, dag_id: str, run_id: str, timeout: float = 60.0) -> None:
        """Wait for the run to end; fail with each failed task instance's error when it did not succeed."""
        state = self.wait_run(dag_id, run_id, timeout)
        if state != "success":
            raise AssertionError(f"run {dag_id}/{run_id} ended {state}:\n{self.failures(dag_id, run_id)}")

    def failures(self, dag_id: str, run_id: str, lines: int = 25) -> str:
        """The failed task instances of a run, each with the last ``lines`` lines of its log (the error)."""
        out = []
        for t in self.task_instances(dag_id, run_id):
            if t["state"] not in ("failed", "upstream_failed"):
                continue
            out.append(f"- {t['task_id']}[{t['map_index']}] {t['state']} try {t['try_number']} on {t.get('hostname')}")
            if t["state"] == "failed":
                out.extend(f"    {line}" for line in self._log_tail(dag_id, run_id, t, lines))
        return "\n".join(out) or "(no failed task instance)"

    def _log_tail(self, dag_id: str, run_id: str, ti: dict, lines: int) -> list[str]:
        """The last lines of a try's log, an error's exception type and message included."""
        try:
            body = self.get(
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}",
                params={"map_index": ti["map_index"], "full_content": "true"},
                headers={"Accept": "application/json"},
            )
        except AssertionError as err:  # the log itself may be what is missing
            return [f"(no log: {err})"]
        rendered = []
        for entry in body.get("content") or []:
            if not isinstance(entry, dict):
                rendered.append(str(entry))
                continue
            rendered.append(str(entry.get("event", "")))
            for detail in entry.get("error_detail") or []:
                rendered.append(f"  {detail.get('exc_type')}: {detail.get('exc_value')}")
        return rendered[-lines:]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of the run (all pages), sorted by (task_id, map_index)."""
        items: list[dict] = []
        while True:
            page = self.get(
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                params={"limit": 100, "offset": len(items)},
            )
            items.extend(page["task_instances"])
            if not page["task_instances"] or len(items) >= page["total_entries"]:
                break
        return sorted(items, key=lambda t: (t["task_id"], t["map_index"]))

    def clear(
        self,
        dag_id: str,
        run_id: str,
        task_ids: Iterable[str | tuple[str, int]],
        *,
        only_failed: bool = False,
        include_downstream: bool = False,
    ) -> list[dict]:
        """Clear task instances for real and return the cleared ones.

        The endpoint defaults to ``dry_run: true`` and ``only_failed: true``; both are turned off here,
        so a succeeded task instance can be cleared too. ``(task_id, map_index)`` clears one mapped
        instance.
        """
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": [list(t) if isinstance(t, tuple) else t for t in task_ids],
            "only_failed": only_failed,
            "include_downstream": include_downstream,
            "reset_dag_runs": True,
        }
        return self.post(f"/dags/{dag_id}/clearTaskInstances", json=body)["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
        """The full log of one try of a task instance, one line per structured log event."""
        body = self.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"map_index": map_index, "full_content": "true"},
            headers={"Accept": "application/json"},
        )
        lines = []
        for entry in body.get("content") or []:
            lines.append(str(entry.get("event", "")) if isinstance(entry, dict) else str(entry))
        return "\n".join(lines)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """The stored XCom value (JSON as the worker wrote it)."""
        entry = self.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"map_index": map_index},
        )
        return entry["value"]


def make_client(stack: AirflowStack) -> AirflowClient:
    """Wrap a healthy stack; raise :class:`StackError` with component logs if auth fails."""
    client = AirflowClient(stack)
    try:
        client.token()
    except httpx.HTTPError as err:
        client.close()
        raise StackError(f"could not log in as {client.username}: {err}\n{stack.log_tails()}") from err
    return client
