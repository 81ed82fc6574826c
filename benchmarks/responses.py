"""The response store's figures: a lookup of 10,000 keys in a store of 1M entries (one ``get_many``).

* ``open``: opening the store and building its in-memory index (once per task).
* ``lookup_miss``: 10,000 keys none of which is stored (the first experiment over new prompts).
* ``lookup_hit``: 10,000 stored keys (a second experiment: every reply read back), as one Arrow
  table (``find``), its token columns only, and as ``ResponseEntry`` objects (``get_many``), with and
  without the requests (``request_json=False``) and without their provenance too (``provenance=False``:
  the reply, its model, tokens and cost only, what the model step and the batch path read); in the store as written
  (20 fragments) and again after ``compact()`` (one fragment, as ``maintain`` leaves it).
* ``put``: one durable append of 256 entries (a write-behind flush at 256 in flight).
* ``throughput``: ``run_items`` of ``llm_process`` (sdk engine) at 256 in flight against a local server
  answering in 100 ms, the response store on (every reply written behind) and off, in the same run;
  then the same prompts again in a new experiment (every answer read from the store).

Two stores: every entry with the same reply and request (``same``: they compress to nothing, so the
figures are the index's and Lance's per-row cost), and each its own (``distinct``: a ~330-byte reply
and a ~100-byte request per entry, what a real store reads).

Target (issue 28): a lookup of 10,000 keys in 1M entries <= 50 ms. ``make bench`` runs it as its
``responses`` section; alone: ``python -m benchmarks.responses [--quick] [--only lookup|throughput]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa


def _keys(start: int, n: int) -> list[str]:
    return [hashlib.sha256(f"r{i}".encode()).hexdigest() for i in range(start, start + n)]


def _fill(root: str, n: int, per_commit: int, distinct: bool = False) -> list[str]:
    """A store of ``n`` entries written ``per_commit`` at a time (straight to Lance: the setup is not measured);
    ``distinct``: each entry its own reply and request, and a flush's created_at per 256 entries."""
    import lance

    from airflow_provider_datagen.core.store import lance_io
    from airflow_provider_datagen.core.store.responses import SCHEMA, key_hash, responses_uri

    uri = responses_uri(root)
    keys = _keys(0, n)
    same_reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": "x" * 200}}]})
    for at in range(0, n, per_commit):
        part = keys[at : at + per_commit]
        if distinct:
            replies = [
                json.dumps(
                    {"id": k[:20], "choices": [{"message": {"role": "assistant", "content": f"{k} {k[::-1] * 3}"}}]}
                )
                for k in part
            ]
            requests = [json.dumps({"messages": [{"role": "user", "content": f"Write about {k}"}]}) for k in part]
            made = np.arange(at, at + len(part)) // 256 * 100_000 + 1_700_000_000_000_000
        else:
            replies, requests, made = [same_reply] * len(part), ['{"messages": []}'] * len(part), np.zeros(len(part))
        table = pa.table(
            {
                "key": part,
                "key_hash": [key_hash(k) for k in part],
                "created_at": pa.array(made.astype(np.int64), pa.timestamp("us", tz="UTC")),
                "pipeline": ["p"] * len(part),
                "experiment": ["e"] * len(part),
                "model": ["openai:gpt-4o-mini"] * len(part),
                "request_json": [r.encode() for r in requests],
                "reply_json": [r.encode() for r in replies],  # blob columns: UTF-8 bytes
                "input_tokens": np.full(len(part), 10),
                "output_tokens": np.full(len(part), 5),
                "cost_usd": np.full(len(part), 0.0001),
            },
            schema=SCHEMA,
        )
        lance.write_dataset(
            table, uri, schema=SCHEMA, mode="append" if at else "create", data_storage_version=lance_io.STORAGE_VERSION
        )
    return keys


def _median_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def _lookups(store: Any, hits: list[str], misses: list[str], repeats: int) -> dict[str, float]:
    # the measures interleaved, each its median over the repeats (a shared machine: a burst hits all alike)
    measures = {
        "lookup_miss_ms_per_10k": lambda: store.find(misses),
        "lookup_hit_ms_per_10k": lambda: store.find(hits),
        "lookup_hit_tokens_only_ms_per_10k": lambda: store.find(hits, columns=["input_tokens", "output_tokens"]),
        "get_many_entries_ms_per_10k": lambda: store.get_many(hits),
        "get_many_without_requests_ms_per_10k": lambda: store.get_many(hits, request_json=False),
        "get_many_answers_only_ms_per_10k": lambda: store.get_many(hits, request_json=False, provenance=False),
    }
    times: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(repeats):
        for name, fn in measures.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: round(statistics.median(ts), 2) for name, ts in times.items()}


def bench(n: int, repeats: int = 7, distinct: bool = False) -> dict[str, Any]:
    """The figures of a store of ``n`` entries (see the module)."""
    from airflow_provider_datagen.core.store.responses import ResponseEntry, ResponseStore

    with tempfile.TemporaryDirectory(prefix="datagen-responses-") as root:
        keys = _fill(root, n, per_commit=max(n // 20, 1), distinct=distinct)
        opens = []
        for _ in range(3):
            t0 = time.perf_counter()
            store = ResponseStore.open(root)
            store.get_many(keys[:1])
            opens.append((time.perf_counter() - t0) * 1000)
        rng = np.random.default_rng(0)
        hits = [keys[i] for i in rng.choice(n, 10_000, replace=False)]
        misses = _keys(n, 10_000)
        got = store.get_many(hits)
        assert len(got) == 10_000 and all(got[k].key == k for k in hits) and not store.get_many(misses)
        assert store.find(hits).num_rows == 10_000
        out: dict[str, Any] = {
            "entries": n,
            "replies": "distinct" if distinct else "same",
            "open_ms": round(statistics.median(opens), 1),
            **_lookups(store, hits, misses, repeats),
        }
        store.compact()
        out["compacted"] = {"fragments": store.stats()["fragments"], **_lookups(store, hits, misses, repeats)}
        batch = [ResponseEntry(k, "{}", "openai:gpt-4o-mini") for k in _keys(10 * n, 256)]
        out["put_256_ms"] = _median_ms(lambda: store.put_many(batch), 5)
    out["target_ms_per_10k"] = 50
    return out


def _server(latency: float) -> tuple[str, Any]:
    """A chat-completions server on 127.0.0.1 answering every request after ``latency`` seconds (aiohttp,
    in a thread of its own); its base URL and a function that stops it."""
    import asyncio
    import threading

    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(latency)
        text = body["messages"][-1]["content"]
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"echo: {text}"}}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    where: dict[str, Any] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        where["runner"], where["port"] = runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    ready.wait()

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(where["runner"].cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()

    return f"http://127.0.0.1:{where['port']}/v1", stop


def throughput(n: int, in_flight: int = 256, latency: float = 0.1, repeats: int = 3) -> dict[str, Any]:
    """Items/s with the store on and off (same run, alternating), and of a rerun answered from the store."""
    import os

    from airflow_provider_datagen.core import CheckpointLog, run_items
    from airflow_provider_datagen.llm import llm_process

    base_url, stop = _server(latency)
    conn = {"conn_type": "pydanticai", "host": base_url, "password": "k", "extra": {"model": "openai-chat:m"}}
    os.environ["AIRFLOW_CONN_LLM_BENCH"] = json.dumps(conn)
    rates: dict[str, list[float]] = {"on": [], "off": [], "reused": []}
    try:
        with tempfile.TemporaryDirectory(prefix="datagen-responses-") as root:
            for r in range(repeats):
                for mode in ("off", "on"):
                    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_bench")
                    if mode == "off":
                        process.uses_response_store = False  # type: ignore[attr-defined]  # run_items opens none
                    items = [{"id": f"q{k}", "text": f"{mode} {r} {k}"} for k in range(n)]
                    for label, experiment in ((mode, f"{mode}{r}"), ("reused", f"{mode}{r}b")):
                        if label == "reused" and mode == "off":
                            continue
                        log = CheckpointLog.open(root, pipeline="p", experiment=experiment)
                        t0 = time.perf_counter()
                        run_items(log, items, process, processor_version=process.version, concurrency=in_flight)
                        rates[label].append(n / (time.perf_counter() - t0))
    finally:
        stop()
    med = {k: round(statistics.median(v), 1) for k, v in rates.items()}
    return {
        "items": n,
        "in_flight": in_flight,
        "latency_s": latency,
        "items_per_s_store_off": med["off"],
        "items_per_s_store_on": med["on"],
        "items_per_s_all_reused": med["reused"],
        "on_over_off": round(med["on"] / med["off"], 3),
        "target_on_over_off": 0.9,
    }


def bench_responses(tmp: Any, quick: bool) -> dict[str, Any]:
    """``make bench``'s ``responses`` section: the lookups at size and the store's cost per request."""
    del tmp  # each measure makes its own store
    n = 100_000 if quick else 1_000_000
    out = {
        "lookup": bench(n),
        "lookup_distinct": bench(n, distinct=True),
        "throughput": throughput(1_000 if quick else 5_000),
    }
    for look in (out["lookup"], out["lookup_distinct"]):
        packed = look["compacted"]
        print(
            f"  {look['entries']:,} entries ({look['replies']} replies), 10,000 stored keys: as a table "
            f"{look['lookup_hit_ms_per_10k']} ms, as entries {look['get_many_entries_ms_per_10k']} ms, without "
            f"requests {look['get_many_without_requests_ms_per_10k']} ms (compacted: "
            f"{packed['lookup_hit_ms_per_10k']} / {packed['get_many_entries_ms_per_10k']} / "
            f"{packed['get_many_without_requests_ms_per_10k']} ms; target <= "
            f"{look['target_ms_per_10k']}); missing {look['lookup_miss_ms_per_10k']} ms; open {look['open_ms']} ms; "
            f"a durable append of 256 {look['put_256_ms']} ms",
            flush=True,
        )
    rate = out["throughput"]
    print(
        f"  {rate['items']:,} items at {rate['in_flight']} in flight: store on / off {rate['on_over_off']}x "
        f"(target >= {rate['target_on_over_off']}); all reused {rate['items_per_s_all_reused']} items/s",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100k entries instead of 1M, 1,000 items instead of 5,000")
    parser.add_argument("--only", choices=("lookup", "throughput"), default=None)
    args = parser.parse_args()
    out: dict[str, Any] = {}
    if args.only in (None, "lookup"):
        out["lookup"] = bench(100_000 if args.quick else 1_000_000)
        out["lookup_distinct"] = bench(100_000 if args.quick else 1_000_000, distinct=True)
    if args.only in (None, "throughput"):
        out["throughput"] = throughput(1_000 if args.quick else 5_000)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
