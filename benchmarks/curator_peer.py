"""The curator row of ``make bench --only model_step``: bespokelabs curator 0.1.31 over the same local server.

Run by ``benchmarks/model_step.py`` with the interpreter of a venv of curator's own
(``DATAGEN_BENCH_CURATOR_PYTHON``), never the project's: ``python curator_peer.py BASE_URL N
CONCURRENCY SALT WORKING_DIR``. It prints one JSON line: wall and CPU time of ``llm(dataset)``
(warm-up excluded). Offline: telemetry off, the cost map and tiktoken's encodings read from litellm's
package, Hugging Face offline; it talks only to ``BASE_URL`` (127.0.0.1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.update(
    TELEMETRY_ENABLED="false",
    LITELLM_LOCAL_MODEL_COST_MAP="True",
    HF_DATASETS_OFFLINE="1",
    HF_HUB_OFFLINE="1",
    CURATOR_DISABLE_RICH_DISPLAY="1",
    CURATOR_VIEWER="0",
    BESPOKE_CURATOR_TRACKER_DISABLED="1",
)


def main() -> int:
    base_url, n, concurrency, salt, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    import litellm

    tokenizers = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(tokenizers))
    os.environ["CURATOR_CACHE_DIR"] = work
    from bespokelabs import curator
    from datasets import Dataset

    class Greeter(curator.LLM):
        def prompt(self, row: dict) -> str:
            return row["prompt"]

        def parse(self, row: dict, response: str) -> dict:
            return {"output": response}

    params = {
        "base_url": base_url,
        "api_key": "sk-bench",
        "max_concurrent_requests": concurrency,
        "max_requests_per_minute": 10_000_000,
        "max_tokens_per_minute": 10_000_000_000,
        "max_retries": 5,
        "require_all_responses": False,
    }

    def run(count: int, tag: str) -> int:
        llm = Greeter(model_name="gpt-4o-mini", backend="openai", backend_params=params)
        rows = [{"prompt": f"Say hello to item {k} of run {salt}-{tag}"} for k in range(count)]
        out = llm(Dataset.from_list(rows), working_dir=str(Path(work) / tag))
        data = out.dataset if hasattr(out, "dataset") else out
        return sum(1 for r in data if r.get("output"))

    run(64, "warm")
    t, c = time.perf_counter(), time.process_time()
    done = run(n, "timed")
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(
        json.dumps(
            {"wall_s": wall, "cpu_s": cpu, "cpu_ms_per_item": cpu / n * 1e3, "items_per_s": n / wall, "done": done}
        )
    )
    return 0 if done == n else 1


if __name__ == "__main__":
    sys.exit(main())
