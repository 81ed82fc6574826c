"""One contender of the cross-host lease test: ``python -m tests._support.workers.lease <json args>``.

Each round starts at a wall-clock instant given by the parent (so the contenders really race), tries
to take the lease, holds it for ``hold`` seconds when it won, and prints one JSON line per round:
``{"round", "won", "start", "end"}`` (the held interval in wall-clock seconds).
"""

from __future__ import annotations

import json
import sys
import time

from airflow_provider_datagen.core.store.lease import ObjectLease


def main() -> None:
    args = json.loads(sys.argv[1])
    for rnd, start_at in enumerate(args["starts"]):
        time.sleep(max(0.0, start_at - time.time()))
        lease = ObjectLease(args["uri"], args["storage_options"], **args["timing"])
        won = lease.acquire()
        start = time.time()
        if won:
            time.sleep(args["hold"])
        end = time.time()
        if won:
            lease.release()
        print(json.dumps({"round": rnd, "won": won, "start": start, "end": end}), flush=True)


if __name__ == "__main__":
    main()
