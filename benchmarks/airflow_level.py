"""The ``airflow`` section of ``benchmarks.run``: ``dag.test()`` figures and figures under the real scheduler.

``python -m benchmarks.airflow_level N`` is a child of ``benchmarks.run`` run inside a migrated
AIRFLOW_HOME (the ``dag.test()`` figures below). :func:`bench_scheduler` runs in the bench process
itself and starts a real stack (:mod:`dev.stack`: api-server, scheduler and dag-processor on 127.0.0.1,
LocalExecutor with ``parallelism=8``, SQLite), see its docstring.

Times ``dag.test()`` of (a) N items as 10 chunks through DatagenMapOperator, (b) the same fake work as N
native mapped task instances, (c) a new run of (a) with 99 % of items done, and (d) (a) on a fresh
experiment with ``concurrency=8``: eight items of a chunk in flight at once, as an I/O-bound model client
would run them.

The first ``dag.test()`` in a process also pays Airflow's one-time start-up: importing and building the
in-process execution API (FastAPI routes, Cadwyn versions) before its first task starts, 5 to 10 s on
this machine. Whichever DAG ran first was charged for it (it was the chunked run, by order alone), so a
one-task DAG that neither variant uses runs first; its time is reported as ``airflow_startup_s``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.fakes import LATENCY_ENV, bench_fails_first

CHUNKED = """
from __future__ import annotations
import pendulum
from airflow.sdk import DAG
from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator
from airflow_provider_datagen.example_dags.fakes import prompts

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="bench", experiment="{experiment}", source=prompts({n}),
                               chunk_size={chunk})
    DatagenMapOperator.partial(task_id="generate", pipeline="bench", experiment="{experiment}",
                               process="benchmarks.fakes:bench_model",
                               concurrency={concurrency}).expand_kwargs(plan.output)
"""

#: Threads per chunk in the concurrent variant: overlapping I/O-bound calls, as a model client would.
CONCURRENCY = 8

NATIVE = """
from __future__ import annotations
import pendulum
from airflow.sdk import DAG, task
from airflow_provider_datagen.example_dags.fakes import prompts
from benchmarks.fakes import bench_work

with DAG("bench_native", schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    @task
    def items():
        return prompts({n})

    @task
    def work(item):
        return bench_work(item)

    work.expand(item=items())
"""

WARMUP = """
from __future__ import annotations
import pendulum
from airflow.sdk import DAG, task

with DAG("bench_warmup", schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    @task
    def noop():
        return None

    noop()
"""


def run(dag_file: Path, dag_id: str) -> float:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file), safe_mode=False, bundle_path=dag_file.parent, bundle_name="dags-folder")
    if bag.import_errors:
        raise SystemExit(str(bag.import_errors))
    dag = bag.dags[dag_id]
    t = time.perf_counter()
    dag.test()
    return time.perf_counter() - t


def main() -> None:
    n = int(sys.argv[1])
    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    os.environ.setdefault(LATENCY_ENV, "0.05")  # a fast model call
    chunk = max(1, n // 10)
    (dags / "bench_chunked.py").write_text(
        CHUNKED.format(n=n, chunk=chunk, dag_id="bench_chunked", experiment="airflow", concurrency=1)
    )
    (dags / "bench_concurrent.py").write_text(
        CHUNKED.format(
            n=n, chunk=chunk, dag_id="bench_concurrent", experiment="airflow_threads", concurrency=CONCURRENCY
        )
    )
    (dags / "bench_native.py").write_text(NATIVE.format(n=n))
    (dags / "bench_warmup.py").write_text(WARMUP)
    startup = run(dags / "bench_warmup.py", "bench_warmup")
    first = run(dags / "bench_chunked.py", "bench_chunked")
    rerun = run(dags / "bench_chunked.py", "bench_chunked")
    concurrent = run(dags / "bench_concurrent.py", "bench_concurrent")
    native = run(dags / "bench_native.py", "bench_native")
    failed = sum(bench_fails_first(f"p{i:04d}") for i in range(n))
    print(
        json.dumps(
            {
                "items": n,
                "chunks": 10,
                "chunked_s": first,
                "first_s": first,
                "rerun_s": rerun,
                "native_s": native,
                "concurrent_s": concurrent,
                "concurrency": CONCURRENCY,
                "airflow_startup_s": startup,
                "done_fraction": 1 - failed / n,
            }
        )
    )


# --- under the real scheduler ---------------------------------------------------------------------

#: The scheduler figures' DAGs. The chunked one reads a JSONL source (as a 10k-prompt job would) and
#: retries the fake model's transient first attempts in place (1 % of items), so one run completes
#: everything and the second run has nothing pending.
SCHED_CHUNKED = """
from __future__ import annotations
import pendulum
from airflow.sdk import DAG
from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False, max_active_runs=1):
    plan = DatagenPlanOperator(task_id="plan", pipeline="bench", experiment="{dag_id}", source="{source}",
                               chunk_size={chunk!r})
    DatagenMapOperator.partial(task_id="generate", pipeline="bench", experiment="{dag_id}",
                               process="benchmarks.fakes:bench_model", concurrency={concurrency},
                               retry={{"attempts": 2, "retry_on": ["benchmarks.fakes.TransientBenchError"],
                                      "backoff": 0.0}}).expand_kwargs(plan.output)
"""

# The baseline imports nothing of the provider: plain Airflow, the same prompts and the same fake work.
SCHED_NATIVE = """
from __future__ import annotations
import pendulum
from airflow.sdk import DAG, task
from benchmarks.fakes import bench_work

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    @task
    def items():
        return [{{"id": f"p{{i:04d}}", "prompt": f"Write a haiku about the number {{i}}."}} for i in range({n})]

    @task
    def work(item):
        return bench_work(item)

    work.expand(item=items())
"""

#: Threads per chunk under the scheduler: the fake call sleeps, so 64 overlap as a model client's would.
SCHED_CONCURRENCY = 64
#: What the chunked DAG of ``main`` did with 1,000 items before: 10 chunks of 100, 8 threads each.
LEGACY_CHUNK, LEGACY_CONCURRENCY = 100, 8


class _Rest:
    """Just enough of Airflow's REST API: a token, parse waits, triggers and run timings."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=30.0)
        token = self.http.post("/auth/token", json={"username": username, "password": password})
        token.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(f"/api/v2{path}", params=params)
        response.raise_for_status()
        return response.json()

    def wait_parsed(self, dag_ids: list[str], timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        for dag_id in dag_ids:
            while self.http.get(f"/api/v2/dags/{dag_id}").status_code != 200:
                errors = self.get("/importErrors")["import_errors"]
                if errors or time.monotonic() > deadline:
                    raise RuntimeError(f"DAG {dag_id} not parsed: {errors}")
                time.sleep(0.5)
            self.http.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()

    def run(self, dag_id: str, timeout: float = 900.0, *, partial_after: float | None = None) -> dict[str, Any]:
        """Trigger a run and wait for it; its wall time from the trigger and Airflow's own timings.

        With ``partial_after`` (seconds), a run still going then is measured as it stands instead:
        ``partial`` is True, ``mapped_done`` counts its finished mapped task instances, and
        ``mapped_per_s`` is their rate since the first of them started (a loaded machine's native
        baseline can take an hour).
        """
        started = time.monotonic()
        response = self.http.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})
        response.raise_for_status()
        run_id = response.json()["dag_run_id"]
        while (run := self.get(f"/dags/{dag_id}/dagRuns/{run_id}"))["state"] not in ("success", "failed"):
            elapsed = time.monotonic() - started
            if partial_after is not None and elapsed > partial_after:
                tis = self._tis(dag_id, run_id)
                done = [t for t in tis if t["map_index"] >= 0 and t["state"] == "success"]
                first = min(_at(t["start_date"]) for t in done) if done else time.time()
                return {
                    "wall_s": None,
                    "partial": True,
                    "elapsed_s": elapsed,
                    "mapped_done": len(done),
                    "mapped_total": sum(1 for t in tis if t["map_index"] >= 0),
                    "mapped_per_s": len(done) / max(time.time() - first, 1e-9),
                }
            if elapsed > timeout:
                raise RuntimeError(f"{dag_id} still {run['state']} after {timeout:.0f} s")
            time.sleep(0.2)
        wall = time.monotonic() - started
        if run["state"] != "success":
            raise RuntimeError(f"{dag_id} run {run_id} {run['state']}")
        return {"wall_s": wall, **_timings(run, self._tis(dag_id, run_id))}

    def _tis(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        tis: list[dict[str, Any]] = []
        while True:  # pages of at most [api] maximum_page_limit
            page = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", limit=100, offset=len(tis))
            tis += page["task_instances"]
            if not page["task_instances"] or len(tis) >= page["total_entries"]:
                return tis


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _timings(run: dict[str, Any], tis: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a run's time went: queued -> first task, the first task, the mapped wave, each TI's duration."""
    ran = [t for t in tis if t["start_date"] and t["end_date"]]
    mapped = [t for t in ran if t["map_index"] >= 0]
    first = [t for t in ran if t["map_index"] < 0 and t["task_id"] in ("plan", "items")]
    out: dict[str, Any] = {"airflow_run_s": _at(run["end_date"]) - _at(run["start_date"]), "task_instances": len(tis)}
    if first:
        out["first_task_s"] = _at(first[0]["end_date"]) - _at(first[0]["start_date"])
    if mapped:
        starts = [_at(t["start_date"]) for t in mapped]
        ends = [_at(t["end_date"]) for t in mapped]
        out["mapped_wave_s"] = max(ends) - min(starts)
        out["mapped_start_spread_s"] = max(starts) - min(starts)
        durations = sorted(t["duration"] for t in mapped if t["duration"] is not None)
        out["mapped_ti_duration_s"] = {
            "min": durations[0],
            "median": durations[len(durations) // 2],
            "max": durations[-1],
        }
    return out


def _shown(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    print(f"  scheduler: {name}: {json.dumps(figures)}", flush=True)
    return figures


def bench_scheduler(tmp: Path, quick: bool, native_partial_after: float | None = None) -> dict[str, Any]:
    """N items x 50 ms through plan + chunks under the real scheduler, against native mapping in the same stack.

    A fresh stack (LocalExecutor, ``parallelism=8``, SQLite; no triggerer, nothing defers), then in
    this order: the chunked DAG over N items with ``chunk_size="auto"`` (one chunk per parallel slot)
    and ``concurrency=64``; the same DAG again with nothing pending; the DAG as it was configured
    before (1,000 items, 10 chunks of 100 at ``concurrency=8``); and native dynamic task mapping over
    1,000 items, one task instance per item. Each time is from the REST trigger to the run's terminal
    state seen by polling every 0.2 s; Airflow's own start/end dates give where the time went.
    ``native_partial_after`` (seconds; ``DATAGEN_BENCH_NATIVE_PARTIAL_AFTER``) stops waiting for the
    native run then and extrapolates its time from the rate of its finished task instances.
    """
    from dev.processes import find_free_port
    from dev.stack import AirflowStack, StackSettings

    n, native_n = (1000, 200) if quick else (10_000, 1000)
    home = tmp / "airflow_scheduler"
    dags = home / "dags"
    dags.mkdir(parents=True)
    source = home / "prompts.jsonl"
    from airflow_provider_datagen.example_dags.fakes import prompts

    with source.open("w") as fh:
        for p in prompts(n):
            fh.write(json.dumps(p) + "\n")
    (dags / "bench_sched_chunked.py").write_text(
        SCHED_CHUNKED.format(dag_id="bench_sched_chunked", source=source, chunk="auto", concurrency=SCHED_CONCURRENCY)
    )
    legacy_source = home / "prompts_1k.jsonl"
    legacy_source.write_text("".join(json.dumps(p) + "\n" for p in prompts(1000)))
    (dags / "bench_sched_legacy.py").write_text(
        SCHED_CHUNKED.format(
            dag_id="bench_sched_legacy", source=legacy_source, chunk=LEGACY_CHUNK, concurrency=LEGACY_CONCURRENCY
        )
    )
    (dags / "bench_sched_native.py").write_text(SCHED_NATIVE.format(dag_id="bench_sched_native", n=native_n))
    checkout = str(Path(__file__).resolve().parents[1])
    settings = StackSettings(
        home=home,
        dags_folder=dags,
        port=find_free_port(),
        log_dir=home / "logs",
        dag_refresh_interval=2,
        parallelism=8,
        extra_env={
            LATENCY_ENV: "0.05",
            # the DAG files import benchmarks.fakes from the checkout
            "PYTHONPATH": os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p),
        },
    )
    booted = time.monotonic()
    with AirflowStack(settings, components=("api-server", "scheduler", "dag-processor")) as stack:
        boot_s = time.monotonic() - booted
        rest = _Rest(settings.base_url, settings.username, settings.password)
        try:
            rest.wait_parsed(["bench_sched_chunked", "bench_sched_legacy", "bench_sched_native"])
            # each figure is printed when measured: a slow machine may be stopped before the native run ends
            chunked = _shown(f"{n} items, chunk_size='auto'", rest.run("bench_sched_chunked"))
            rerun = _shown("the same, nothing pending", rest.run("bench_sched_chunked"))
            legacy = _shown("1,000 items, 10 chunks, concurrency=8", rest.run("bench_sched_legacy"))
            native = _shown(
                f"native mapping, {native_n} items",
                rest.run("bench_sched_native", timeout=3600.0, partial_after=native_partial_after),
            )
        except Exception as exc:
            raise RuntimeError(f"{exc}\n{stack.log_tails()}") from exc
        finally:
            rest.http.close()
    if native.get("partial"):
        # the rate of the finished task instances, for the whole count (plus the items task's time)
        native["wall_s"] = native_n / native["mapped_per_s"]
    per_item = {
        k: v["wall_s"] / m
        for k, v, m in (("chunked", chunked, n), ("legacy", legacy, 1000), ("native", native, native_n))
    }
    return {
        "items": n,
        "fake_work_s": 0.05,
        "parallelism": 8,
        "concurrency": SCHED_CONCURRENCY,
        "chunks": chunked["task_instances"] - 1,
        "stack_boot_s": boot_s,
        "chunked": chunked,
        "rerun_nothing_pending": rerun,
        "legacy_1k_10_chunks_c8": legacy,
        "native_items": native_n,
        "native": native,
        "seconds_per_item": per_item,
        # per item, the chunked run against native mapping of the same stack (same-run baseline)
        "native_vs_chunked_per_item": per_item["native"] / per_item["chunked"],
        "native_vs_legacy_per_item": per_item["native"] / per_item["legacy"],
        "native_at_chunked_size_s": per_item["native"] * n,
    }


if __name__ == "__main__":
    main()
