"""``make demo``: the quickstart in real Airflow, a failure, a CLI clear, a rerun of only what is pending.

Everything lives under ``.demo/`` (wiped at start): a SQLite metadata DB, the DAGs folder, the event
log and the exports. Airflow's api-server, scheduler, dag-processor and triggerer run on 127.0.0.1 (a
free port) with LocalExecutor and are stopped by PID at the end. The DAG's process is the installed
fake model wrapped by :mod:`dev.counted_model`, which records every invocation so that the demo can
show that the rerun invoked only the failed items. Its errors are ones the quickstart's retry policy
does not cover (transient ones the DAG retries in place, in the same run).

Usage (from the repository root)::

    python -m dev.demo
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import airflow_provider_datagen.example_dags as example_dags
from airflow_provider_datagen.core import CheckpointLog, export_results, run_items
from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from dev.counted_model import CALLS_ENV
from dev.processes import find_free_port
from dev.stack import AirflowStack, StackSettings

DAG_ID = "datagen_quickstart"
_CHECKOUT = Path(__file__).resolve().parents[1]
EXPERIMENT = "demo"
N_ITEMS = 200


def _say(text: str = "") -> None:
    print(text, flush=True)


class _Rest:
    """Just enough of Airflow's REST API, with a SimpleAuthManager token."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base = base_url
        self.username = username
        self.password = password
        self._token: str | None = None

    def _call(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def token(self) -> str:
        if self._token is None:
            self._token = self._call(
                "POST", "/auth/token", {"username": self.username, "password": self.password}, auth=False
            )["access_token"]
        return self._token

    def get(self, path: str) -> Any:
        return self._call("GET", "/api/v2" + path)


def _wait(what: str, check: Any, timeout: float, stack: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            value = check()
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            value = None
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"demo: timed out after {timeout:.0f} s waiting for {what}")


def _calls(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line.split("\t")[0] for line in path.read_text().splitlines() if line]


def _status_table(log: Any) -> str:
    s = log.summary()
    rows = [
        ("completed", s["completed"]),
        ("filtered", s["filtered"]),
        ("running (pending)", s["running"]),
        ("  of which failed", s["failed_items"]),
        ("total", s["total"]),
    ]
    lines = [f"    {name:<20} {value:>6}" for name, value in rows]
    lines.append(f"    log version {s['log_version']}; failed items: {', '.join(s['failed_item_ids'][:10])}")
    return "\n".join(lines)


def main() -> int:
    repo = Path.cwd()
    demo = repo / ".demo"
    shutil.rmtree(demo, ignore_errors=True)
    dags = demo / "dags"
    dags.mkdir(parents=True)
    example = Path(example_dags.__file__).parent / "datagen_quickstart.py"
    shutil.copy(example, dags / example.name)
    calls = demo / "invocations.tsv"
    exports = demo / "exports"
    settings = StackSettings(
        home=demo / "airflow",
        dags_folder=dags,
        port=find_free_port(),
        dag_refresh_interval=2,
        extra_env={
            "DATAGEN_QUICKSTART_PROCESS": "dev.counted_model:fake_model",
            CALLS_ENV: str(calls),
            # The workers run in the Airflow home, not here; they import dev.counted_model from the checkout.
            "PYTHONPATH": os.pathsep.join(p for p in (str(_CHECKOUT), os.environ.get("PYTHONPATH")) if p),
            "DATAGEN_QUICKSTART_EXPERIMENT": EXPERIMENT,
            "DATAGEN_QUICKSTART_ITEMS": str(N_ITEMS),
            "DATAGEN_QUICKSTART_CHUNK": "50",
            "DATAGEN_EXPORT_DIR": str(exports),
        },
    )
    _say(
        f"== airflow-provider-datagen demo: {N_ITEMS} prompts, a fake model that refuses some first attempts "
        "(errors the DAG's retry policy does not cover)"
    )
    _say(f"   metadata DB and logs under {demo}; Airflow on {settings.base_url} (127.0.0.1 only)")
    stack = AirflowStack(settings)
    try:
        stack.start()
        took = stack.wait_healthy(timeout=240)
        _say(f"-- Airflow api-server, scheduler, dag-processor, triggerer are up ({took:.0f} s)")
        env = stack.env

        def cli(*args: str) -> str:
            out = subprocess.run(
                [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise SystemExit(f"demo: `airflow {' '.join(args)}` failed:\n{out.stdout}\n{out.stderr}")
            return out.stdout

        rest = _Rest(settings.base_url, settings.username, settings.password)
        _wait("the DAG to be parsed", lambda: rest.get(f"/dags/{DAG_ID}"), 120, stack)
        cli("dags", "unpause", DAG_ID)
        run_id = "demo_run"
        _say(f"$ airflow dags trigger {DAG_ID} --run-id {run_id}")
        cli("dags", "trigger", DAG_ID, "--run-id", run_id)

        def run_state() -> str | None:
            st = rest.get(f"/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
            return st if st in ("success", "failed") else None

        first_state = _wait("the first run", run_state, 300, stack)
        first_calls = _calls(calls)
        _say(f"-- run 1 ended {first_state}: the fake model was invoked {len(first_calls)} times")
        tis = rest.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
        failed = sorted(ti["map_index"] for ti in tis if ti["task_id"] == "generate" and ti["state"] == "failed")
        _say(f"   failed map indexes of 'generate': {failed}")

        log = CheckpointLog.open(settings.home / "datagen", pipeline="quickstart", experiment=EXPERIMENT)
        _say("-- folded status from the event log after run 1:")
        _say(_status_table(log))
        states = log.states()
        completed_after_first = {
            iid for iid, st in zip(states["item_id"].to_pylist(), states["status"].to_pylist()) if st == "completed"
        }

        _say(f"$ airflow tasks clear {DAG_ID} -t generate --only-failed --downstream --yes")
        cli("tasks", "clear", DAG_ID, "-t", "generate", "--only-failed", "--downstream", "--yes")
        second_state = _wait("the rerun", run_state, 300, stack)
        second_calls = _calls(calls)[len(first_calls) :]
        _say(f"-- run 1 after the clear ended {second_state}: the model was invoked {len(second_calls)} times")
        _say("-- folded status after the rerun:")
        _say(_status_table(log))

        again = sorted(set(second_calls) & completed_after_first)
        counts = collections.Counter(_calls(calls))
        twice = sorted(i for i, n in counts.items() if n > 1)
        _say(f"   items processed: run 1 {len(first_calls)}, rerun {len(second_calls)} (only the failed ones)")
        _say(f"   completed items invoked again by the rerun: {len(again)} {again[:5] if again else ''}")
        _say(f"   items invoked twice overall: {len(twice)} (each refused once on its first attempt, not retried)")

        export = rest.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/export/xcomEntries/return_value")
        value = export["value"]
        resumed = value if isinstance(value, dict) else json.loads(value)

        baseline_log = CheckpointLog.open(demo / "baseline", pipeline="quickstart", experiment="uninterrupted")
        run_items(baseline_log, prompts(N_ITEMS), reliable_fake_model)
        baseline = export_results(baseline_log, str(exports / "baseline.lance"))
        usage = log.usage()
        _say("-- what the run cost (the usage ledger: every attempt the fake model reported):")
        _say(
            f"   {usage['calls']} calls, {usage['input_tokens']} input + {usage['output_tokens']} output tokens, "
            f"${usage['cost_usd']:.6f} (of which failed attempts ${usage['failed_attempts_cost_usd']:.6f}; "
            f"{usage['unpriced_calls']} calls unpriced)"
        )
        for model, m in usage["by_model"].items():
            _say(
                f"   {model}: {m['calls']} calls, {m['input_tokens'] + m['output_tokens']} tokens, ${m['cost_usd']:.6f}"
            )
        _say("-- export fingerprints:")
        _say(f"   resumed run:         {resumed['fingerprint']} ({resumed['rows']} rows)")
        _say(f"   uninterrupted run:   {baseline['fingerprint']} ({baseline['rows']} rows)")
        ok = (
            second_state == "success"
            and usage["calls"] == len(_calls(calls))  # every invocation reported usage, none counted twice
            and not again
            and resumed["fingerprint"] == baseline["fingerprint"]
            and resumed["rows"] == N_ITEMS
        )
        _say(f"== {'OK' if ok else 'MISMATCH'}: resumed == uninterrupted, and no completed item ran twice")
        return 0 if ok else 1
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
