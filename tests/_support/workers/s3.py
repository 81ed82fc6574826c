"""Roles of the object-store test, each run as its own process with the connection in the environment.

    python -m tests._support.workers.s3 writer  --conn datagen_s3 --writer w1 --items 25 --checkpoint-every 3
    python -m tests._support.workers.s3 writer  ... --kill-after 2      # SIGKILL after its 2nd commit
    python -m tests._support.workers.s3 maintain --conn datagen_s3 --stop-file F
    python -m tests._support.workers.s3 ui      --conn datagen_s3 --bad-conn datagen_s3_bad

Every role resolves the log through :class:`DatagenHook` from ``AIRFLOW_CONN_<ID>`` (credentials live
only in the connection's extras), logs at DEBUG to stderr (Python and Lance), and prints one line
``RESULT <json>`` on stdout holding what an operator would push as XComs, the hook's repr and any error
message, so the test can grep everything a user could ever see for the secret values.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

PIPELINE = "s3p"
EXPERIMENT = "e1"


def items_for(writer: str, n: int) -> list[dict[str, Any]]:
    return [{"id": f"{writer}-{k}", "n": k, "text": f"{writer} says {k}"} for k in range(n)]


def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.append("trail", item["n"] % 3)
    return {"square": item["n"] ** 2, "echo": item["text"].upper(), "key": ctx.key}


def _result(payload: dict[str, Any]) -> None:
    sys.stdout.write("RESULT " + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def _hook(conn_id: str) -> Any:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    hook = DatagenHook(datagen_conn_id=conn_id)
    logging.getLogger("s3_worker").info("resolved %r root=%s options=%s", hook, hook.root, sorted(hook.storage_options))
    return hook


def writer(args: argparse.Namespace) -> None:
    from airflow_provider_datagen.core import run_items, status_of
    from airflow_provider_datagen.core.store.log import CheckpointLog, LogWriter

    hook = _hook(args.conn)
    log = hook.get_log(PIPELINE, EXPERIMENT)
    rows = {"rows": 0, "commits": 0}
    append = CheckpointLog.append

    def counted(self: Any, table: Any) -> None:
        append(self, table)
        rows["rows"] += table.num_rows
        rows["commits"] += 1

    CheckpointLog.append = counted  # type: ignore[method-assign]
    if args.kill_after:
        commit = LogWriter.commit

        def killing(self: Any, batch: Any, **kw: Any) -> int:
            n = commit(self, batch, **kw)
            if self.commits >= args.kill_after:
                self.log.wait_appends()  # the counted rows have landed
                _result({"killed_after": self.commits, **rows})
                os.kill(os.getpid(), signal.SIGKILL)
            return n

        LogWriter.commit = killing  # type: ignore[method-assign]
    items = items_for(args.writer, args.items)
    ce = None if args.checkpoint_every == "none" else int(args.checkpoint_every)
    report = run_items(
        log,
        items,
        process,
        checkpoint_every=ce,
        writer_id=args.writer,
        epoch=log.next_epoch(),
        checkpoint_interval=0.2,
    )
    _result(
        {
            "report": report.as_dict(),
            "status": status_of(log, items),
            "summary": log.summary(),
            "hook": repr(hook),
            "log": repr(log),
            **rows,
        }
    )


def maintain(args: argparse.Namespace) -> None:
    log = _hook(args.conn).get_log(PIPELINE, EXPERIMENT)
    runs: list[dict[str, Any]] = []
    errors: list[str] = []
    while not os.path.exists(args.stop_file):
        if not log.exists():
            time.sleep(0.1)
            continue
        try:
            runs.append(log.maintain())
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        time.sleep(0.5)
    runs.append(log.maintain())
    _result({"runs": runs, "errors": errors})


def ui(args: argparse.Namespace) -> None:
    """The plugin's pages and JSON through Airflow's own API server app, for the good and a bad connection."""
    os.environ.update(
        {
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__API_AUTH__JWT_SECRET": "datagen-s3-ui-" + "k" * 50,
            "AIRFLOW__DATAGEN__UI_CONN_ID": args.conn,
            # a password file of its own: the plugin tests' API server keeps theirs
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": args.passwords_file,
        }
    )
    from airflow.api_fastapi.app import create_app
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from fastapi.testclient import TestClient

    from airflow_provider_datagen.plugins.data import reset_reader

    reset_reader()
    app = create_app()
    client = TestClient(app)
    with open(SimpleAuthManager.get_generated_password_file()) as f:
        password = json.load(f)["admin"]
    token = client.post("/auth/token", json={"username": "admin", "password": password}).json()["access_token"]
    client.cookies.set("_token", token)
    base = f"/datagen/experiments/{PIPELINE}/{EXPERIMENT}"
    api = f"/datagen/api/experiments/{PIPELINE}/{EXPERIMENT}"
    paths = [
        "/datagen/",
        "/datagen/api/experiments",
        base,
        api,
        f"{api}/items",
        f"{base}/item?id=w0-1",
        f"{api}/item?id=w0-1",
    ]
    pages: dict[str, Any] = {}
    for path in paths:
        r = client.get(path)
        pages[path] = {"status": r.status_code, "body": r.text}
    os.environ["AIRFLOW__DATAGEN__UI_CONN_ID"] = args.bad_conn
    reset_reader()
    for path in ["/datagen/", base, api]:
        r = client.get(path)
        pages[f"bad:{path}"] = {"status": r.status_code, "body": r.text}
    _result({"pages": pages})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["writer", "maintain", "ui"])
    p.add_argument("--conn", required=True)
    p.add_argument("--bad-conn", default=None)
    p.add_argument("--writer", default="w0")
    p.add_argument("--items", type=int, default=10)
    p.add_argument("--checkpoint-every", default="none")
    p.add_argument("--kill-after", type=int, default=0)
    p.add_argument("--stop-file", default=None)
    p.add_argument("--passwords-file", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    try:
        {"writer": writer, "maintain": maintain, "ui": ui}[args.role](args)
    except Exception as exc:
        _result({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        sys.exit(1)


if __name__ == "__main__":
    main()
