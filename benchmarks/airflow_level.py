"""Child of ``benchmarks.run`` (section ``airflow``): runs inside a migrated AIRFLOW_HOME.

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
from pathlib import Path

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


if __name__ == "__main__":
    main()
