"""The quickstart's fake model with every invocation appended to a file: how the demo counts reruns.

The demo points the quickstart DAG at :func:`fake_model` (``DATAGEN_QUICKSTART_PROCESS``) and names the
file in ``DATAGEN_DEMO_CALLS``; each line is ``item_id, attempt, pid``. The answers are the installed
fake's, so the export is the same as with the DAG's default process; its errors are the non-retryable
kind, so the demo still shows a failed task, a clear and a rerun of only the failed items.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.example_dags import fakes

if TYPE_CHECKING:
    from airflow_provider_datagen.core import ItemContext

CALLS_ENV = "DATAGEN_DEMO_CALLS"


def fake_model(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    """:func:`airflow_provider_datagen.example_dags.fakes.fake_model_with_refusals`, recorded before it runs.

    Its errors are not retryable, so the quickstart's retry policy leaves them to a clear and a rerun.
    """
    with open(os.environ[CALLS_ENV], "a", encoding="utf-8") as fh:
        fh.write(f"{ctx.item_id}\t{ctx.attempt}\t{os.getpid()}\n")
    return fakes.fake_model_with_refusals(item, ctx)
