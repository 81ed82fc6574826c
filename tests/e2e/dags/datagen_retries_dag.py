"""Plan -> mapped generation with ``retry=`` -> export, over a fake model whose first calls time out for 10% of items.

``tests/e2e/test_retries_airflow.py`` copies this file into the stack's DAGs folder as ``<name>.py``
next to ``<name>.json`` (the knobs: dag id, experiment, items, chunk size, concurrency, pool slots,
the invocation side file and the export directory). Imported without that JSON (as the test does, for
:func:`transient_first` and :func:`model`) it defines no DAG.

``model`` is the process: it appends ``item_id, attempt, pid`` to the invocation side file, then raises
:class:`~airflow_provider_datagen.example_dags.fakes.TransientModelError` on the first attempt of the
items :func:`transient_first` picks (deterministic by the item's key: one in ten by its hash), and
otherwise answers as :func:`~airflow_provider_datagen.example_dags.fakes.reliable_fake_model`, so an
in-process run of that function is the uninterrupted baseline. The task imports it by name
(``"<name>:model"``): Airflow puts the DAGs folder on the task's ``sys.path``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from airflow_provider_datagen.example_dags.fakes import TransientModelError, prompts, reliable_fake_model

MODULE = Path(__file__).stem
CONFIG_PATH = Path(__file__).with_suffix(".json")
CONFIG: dict[str, Any] = json.loads(CONFIG_PATH.read_text()) if CONFIG_PATH.exists() else {}

#: What the DAG's retry policy retries (as dotted names, the form a Variable or params would give).
TRANSIENT_ERROR = f"{TransientModelError.__module__}.{TransientModelError.__qualname__}"


def transient_first(item_id: str) -> bool:
    """One item in ten (by a hash of its key) times out on its first attempt."""
    return int(hashlib.sha256(item_id.encode("utf-8")).hexdigest()[:8], 16) % 10 == 0


def model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    with open(CONFIG["invocation_log"], "a", encoding="utf-8") as fh:
        fh.write(f"{ctx.item_id}\t{ctx.attempt}\t{os.getpid()}\n")
    if ctx.attempt == 1 and transient_first(ctx.item_id):
        raise TransientModelError(f"model endpoint timed out for {ctx.item_id} (a fake, transient error)")
    return reliable_fake_model(item, ctx)


if CONFIG:
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_datagen.operators.datagen import (
        DatagenExportOperator,
        DatagenMapOperator,
        DatagenPlanOperator,
    )

    with DAG(
        dag_id=CONFIG["dag_id"],
        schedule=None,
        start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
        catchup=False,
        # No Airflow retries: the run must succeed with every task on its first try.
        default_args={"retries": 0},
        tags=["datagen", "e2e"],
    ):
        plan = DatagenPlanOperator(
            task_id="plan",
            pipeline=CONFIG["pipeline"],
            experiment=CONFIG["experiment"],
            source=prompts(int(CONFIG["items"])),
            key_field="id",
            chunk_size=int(CONFIG["chunk"]),
            processor_version="v1",
        )
        extra: dict[str, Any] = {}
        if CONFIG.get("pool"):
            extra = {"pool": CONFIG["pool"], "pool_slots": int(CONFIG.get("pool_slots", 1))}
        generate = DatagenMapOperator.partial(
            task_id="generate",
            pipeline=CONFIG["pipeline"],
            experiment=CONFIG["experiment"],
            process=f"{MODULE}:model",
            processor_version="v1",
            checkpoint_every=5,
            concurrency=int(CONFIG.get("concurrency", 1)),
            # A dict, as params or a Variable would give it: up to 3 calls per item, 50 ms then 100 ms apart.
            retry={"attempts": 3, "retry_on": [TRANSIENT_ERROR], "backoff": 0.05, "max_backoff": 1.0, "jitter": False},
            **extra,
        ).expand_kwargs(plan.output)
        export = DatagenExportOperator(
            task_id="export",
            pipeline=CONFIG["pipeline"],
            experiment=CONFIG["experiment"],
            destination=CONFIG["export_dir"] + "/export.lance",
            trigger_rule="none_failed",
        )
        plan >> generate >> export
