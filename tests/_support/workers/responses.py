"""A ``run_items`` worker of the model step against the local OpenAI-compatible server, killed by its parent.

    python -m tests._support.workers.responses --root DIR --experiment E --n-items 300 --base-url URL
    (and --engine pydantic-ai for the agent engine; the sdk engine by default)

Runs ``llm_process`` (the response store on) with group commit, so replies arrive well
before their items are acknowledged: the parent SIGKILLs it mid-run and checks that the rerun does not
ask again what the server answered before the kill (tests/llm/test_reuse_crash.py).
"""

from __future__ import annotations

import argparse
import json
import os

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.llm import llm_process


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--n-items", type=int, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--engine", default="sdk")
    args = parser.parse_args()
    conn = {"conn_type": "pydanticai", "host": args.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    os.environ["AIRFLOW_CONN_LLM_KILLED"] = json.dumps(conn)
    log = CheckpointLog.open(args.root, pipeline="p", experiment=args.experiment)
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_killed", engine=args.engine)
    items = [{"id": f"q{k}", "text": f"word {k}"} for k in range(args.n_items)]
    report = run_items(log, items, process, processor_version=process.version, concurrency=args.concurrency)
    print(json.dumps({"processed": len(report.processed)}))


if __name__ == "__main__":
    main()
