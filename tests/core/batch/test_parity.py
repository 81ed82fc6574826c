"""A batch run and an online run of the same step over the same answers: the same export, half the cost.

The fake server answers ``/v1/chat/completions`` exactly as a batch row of the same body
(dev/batch_answers.py), so ``run_items`` with ``llm_process`` (online) and ``run_batch`` with
``llm_batch`` over one server must record the same fields, and the batch run's ledger must be the
online one's at half the price.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.export import collect_results, results_fingerprint
from airflow_provider_datagen.llm import llm_process
from dev.batch_server import serving
from tests.core.batch.helpers import OPENAI_MODEL, PROMPT, make_items, openai_step, run

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog


@pytest.mark.parametrize("n", [200, pytest.param(2000, marks=pytest.mark.slow)])
def test_a_batch_run_exports_what_an_online_run_does_at_half_its_cost(
    checkpoint_log: Callable[..., CheckpointLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    # 2,000 items is the figure (about 100 s online on a loaded machine: marked slow); 200 in the inner loop
    items = make_items(n)
    with serving(complete_after_polls=2, shuffle_results=True) as fake:
        conn = {
            "conn_type": "pydanticai",
            "host": fake.base_url,
            "password": "sk-fake",
            "extra": {"model": "openai-chat:gpt-4o-mini"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_LLM_PARITY", json.dumps(conn))
        online_log = checkpoint_log("online")
        process = llm_process(PROMPT, llm_conn_id="llm_parity")
        version = process.version  # type: ignore[attr-defined]
        online = run_items(online_log, items, process, processor_version=version, concurrency=16)
        assert online.failed == [] and len(online.processed) == n and fake.online_requests == n

        batch_log = checkpoint_log("batch")
        # the helpers pass reuse=False: the batch itself is what this compares (with reuse it would submit nothing)
        report = run(batch_log, items, openai_step(fake.base_url))
        assert report.failed == [] and len(report.processed) == n and fake.creates == 1

    online_results, batch_results = collect_results(online_log), collect_results(batch_log)
    assert len(batch_results) == n
    assert batch_results == online_results
    assert results_fingerprint(batch_results) == results_fingerprint(online_results)
    exported = [
        export_results(log, str(tmp_path / f"{name}.lance"))["fingerprint"]
        for name, log in (("online", online_log), ("batch", batch_log))
    ]
    assert exported[0] == exported[1]

    online_usage, batch_usage = online_log.usage(), batch_log.usage()
    assert online_usage["cost_usd"] > 0
    assert batch_usage["cost_usd"] == pytest.approx(online_usage["cost_usd"] / 2, rel=1e-9)
    for key in ("calls", "input_tokens", "output_tokens"):
        assert batch_usage[key] == online_usage[key]
    assert set(batch_usage["by_model"]) == set(online_usage["by_model"]) == {OPENAI_MODEL}


def test_a_batch_run_after_an_online_run_of_the_same_prompts_submits_nothing(
    checkpoint_log: Callable[..., CheckpointLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    items = make_items(50)
    with serving(complete_after_polls=1) as fake:
        conn = {
            "conn_type": "pydanticai",
            "host": fake.base_url,
            "password": "sk-fake",
            "extra": {"model": "openai-chat:gpt-4o-mini"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_LLM_PARITY", json.dumps(conn))
        online_log = checkpoint_log("online")
        process = llm_process(PROMPT, llm_conn_id="llm_parity")
        run_items(online_log, items, process, processor_version=process.version, concurrency=8)  # type: ignore[attr-defined]
        assert fake.online_requests == 50

        batch_log = checkpoint_log("batch")
        report = run(batch_log, items, openai_step(fake.base_url, reuse=True))
        assert report.failed == [] and len(report.processed) == 50
        assert fake.creates == 0  # every request was answered from the response store
        assert fake.online_requests == 50
        assert collect_results(batch_log) == collect_results(online_log)
        usage = batch_log.usage()
        assert (usage["calls"], usage["cost_usd"], usage["reused_calls"]) == (0, 0.0, 50)
        assert usage["saved_usd"] == pytest.approx(online_log.usage()["cost_usd"])

        # and a batch's rows are stored too: an online run after a batch run asks nothing
        new = [{"id": f"n{k}", "text": f"new {k}"} for k in range(10)]
        run(checkpoint_log("batch2"), new, openai_step(fake.base_url, reuse=True))
        assert fake.creates == 1
        again = checkpoint_log("online2")
        run_items(again, new, process, processor_version=process.version)  # type: ignore[attr-defined]
        assert fake.online_requests == 50
        assert again.usage()["reused_calls"] == 10
