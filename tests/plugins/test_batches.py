"""The UI's view of batch mode: the experiment page lists open batches, the item page each attempt's batch."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from airflow_provider_datagen.core import run_batch
from airflow_provider_datagen.core.batch import BatchConfig, BatchRun
from airflow_provider_datagen.llm import llm_batch
from dev.batch_server import FakeBatchServer

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

P = "uibatch"
ITEMS = [{"id": f"k{i}", "text": f"text {i}"} for i in range(5)]


def test_open_batches_are_listed_with_their_items_then_the_attempt_names_its_batch(client: TestClient, ui_log) -> None:
    lg = ui_log(P, "open")
    with FakeBatchServer(complete_after_polls=1000) as srv:
        step = llm_batch("Say {{ text }}", model_id="openai:gpt-4o-mini", base_url=srv.base_url, api_key="k")
        run = BatchRun(
            lg, ITEMS, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=lg.next_epoch())
        )
        client_ = step.client()
        try:
            (sub,) = run.advance(client_)
        finally:
            client_.close()
        page = client.get(f"/datagen/experiments/{P}/open").text
        section = page[page.index("<h2 id='batches'>") : page.index("<h2 id='spend'>")]
        assert "(5 items submitted and not yet back)" in section
        assert f"<td class='mono'>{sub.batch_id}</td><td>openai</td><td>submitted</td>" in section
        status = client.get(f"/datagen/api/experiments/{P}/open").json()
        assert status["in_batch"] == 5
        assert [b["batch_id"] for b in status["batches"]] == [sub.batch_id]

        srv.complete_after_polls = 0
        report = run_batch(
            lg, ITEMS, step, processor_version=step.version, writer_id="w", epoch=lg.next_epoch(), poll_interval=0
        )
        assert report.batches == [sub.batch_id]  # re-attached, not submitted again
        assert len(srv.batches) == 1
    page = client.get(f"/datagen/experiments/{P}/open").text
    assert "<h2 id='batches'>" not in page  # nothing open any more
    assert client.get(f"/datagen/api/experiments/{P}/open").json()["in_batch"] == 0
    item = client.get(f"/datagen/experiments/{P}/open/item?id=k0").text
    cells = re.findall(r"<td class='mono batch-attempt'>([^<]*)</td>", item)
    assert len(cells) == 1 and cells[0].startswith(f"{sub.batch_id} · ") and cells[0].endswith("-1")
