"""What the celery scenarios share: a REST client over the distributed stack, DAG installs, records."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lance
import pyarrow.compute as pc

from airflow_provider_datagen.core import CheckpointLog, EventType, export_results, run_items
from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from dev.celery_stack import BUCKET, ROOT
from tests.e2e.harness import AirflowClient

if TYPE_CHECKING:
    from dev.celery_stack import CeleryStack

PIPELINE = "celery"
TEMPLATE = Path(__file__).parent / "dags" / "datagen_celery_dag.py"
RUN_TIMEOUT = 900.0


class CeleryClient(AirflowClient):
    """:class:`AirflowClient` over the stack's api-server; DAG files go to every host's DAGs folder."""

    def __init__(self, cluster: CeleryStack) -> None:
        super().__init__(cluster.control)
        self.cluster = cluster
        self.boot_seconds = 0.0
        self._http.timeout = 120.0  # a loaded single-process api-server answers slowly, not wrongly

    def failures(self, dag_id: str, run_id: str, lines: int = 25) -> str:
        """The failed task instances with their logs, and what the scheduler logged about the run's failures.

        A try that failed before its task process started (an Execution API call that timed out, a
        LocalExecutor workload that raised) has an empty task log: the cause is in the scheduler's.
        """
        found = super().failures(dag_id, run_id, lines)
        if found.startswith("(no failed"):
            return found
        return found + "\n" + scheduler_evidence(self.cluster.settings.logs / "scheduler.log", run_id)

    def add_dag_file(self, src: Path | str, name: str) -> Path:
        text = src if isinstance(src, str) and "\n" in src else Path(src).read_text()
        self.cluster.add_dag_file(name, text)
        return self.dags_folder / name


@dataclass(frozen=True)
class Invocation:
    item_id: str
    attempt: int
    pid: int
    host: str
    at: float


@dataclass
class CeleryDag:
    """One scenario's DAG on the stack: its ids, its log on S3 and its invocation records."""

    client: CeleryClient
    dag_id: str
    experiment: str
    items: int
    invocation_log: Path

    def log(self) -> CheckpointLog:
        return CheckpointLog.open(
            ROOT, pipeline=PIPELINE, experiment=self.experiment, storage_options=self.client.cluster.storage_options()
        )

    def invocations(self) -> list[Invocation]:
        out = []
        for line in self.invocation_log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 5:
                out.append(Invocation(parts[0], int(parts[1]), int(parts[2]), parts[3], float(parts[4])))
        return out

    def writer_id(self, run_id: str, map_index: int) -> str:
        return f"{self.dag_id}/{run_id}/generate/{map_index}"


#: what, on a scheduler log line about a run, says why a task instance failed
_FAILURE_WORDS = ("fail", "error", "heartbeat", "queued", "timed out", "timeout", "killed", "sigkill")


def scheduler_evidence(path: Path, run_id: str, most: int = 80) -> str:
    """The scheduler log's lines about ``run_id``'s failures, and every LocalExecutor workload traceback."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"(no scheduler log at {path})"
    picked: list[str] = []
    follow = 0
    for line in text:
        low = line.lower()
        if "workload execution failed" in low:
            follow = 25  # the traceback that follows names the cause
            picked.append(line)
        elif follow:
            follow -= 1
            picked.append(line)
        elif run_id in line and any(word in low for word in _FAILURE_WORDS):
            picked.append(line)
    body = "\n".join(f"    {line}" for line in picked[-most:]) or "    (nothing)"
    return f"- the scheduler log ({path}) on this run's failures:\n{body}"


def install(client: CeleryClient, dag_id: str, *, experiment: str | None = None, **knobs: Any) -> CeleryDag:
    """Write ``<dag_id>.json`` and ``<dag_id>.py`` into every DAGs folder; wait until parsed; unpause."""
    shared = client.cluster.settings.shared
    calls = shared / f"{dag_id}.tsv"
    calls.touch()
    config = {
        "dag_id": dag_id,
        "pipeline": PIPELINE,
        "experiment": experiment or dag_id,
        "invocation_log": str(calls),
        "export_prefix": f"s3://{BUCKET}/exports/{dag_id}",
        "barrier_dir": str(shared / f"{dag_id}.barrier"),
        **knobs,
    }
    client.add_dag_file(json.dumps(config, indent=1) + "\n", f"{dag_id}.json")
    client.add_dag_file(TEMPLATE.read_text(), f"{dag_id}.py")
    client.wait_dag_parsed(dag_id, timeout=240)
    client.unpause(dag_id)
    return CeleryDag(client, dag_id, config["experiment"], int(knobs["items"]), calls)


def baseline_fingerprint(tmp_path: Path, n: int) -> str:
    """The export fingerprint of ``prompts(n)`` run uninterrupted in this process on a local log."""
    log = CheckpointLog.open(tmp_path / "baseline", pipeline=PIPELINE, experiment="uninterrupted")
    report = run_items(log, prompts(n), reliable_fake_model, processor_version="v1")
    assert not report.failed and len(report.processed) == n
    return str(export_results(log, str(tmp_path / "baseline.lance"))["fingerprint"])


def item_ids(n: int) -> list[str]:
    return [p["id"] for p in prompts(n)]


def event_counts(log: CheckpointLog, event_type: EventType) -> Counter[str]:
    """How many distinct events of one type each item has in the log (one scan of the dataset on S3).

    Distinct by event id: two writers acknowledging the same step write the same event (ADR 0002),
    which the read path counts once.
    """
    ds = lance.dataset(log.uri, storage_options=log.storage_options)
    table = ds.to_table(columns=["item_id", "event_type", "event_id"])
    rows = table.filter(pc.equal(table["event_type"], event_type.value))
    return Counter(item for item, _ in set(zip(rows["item_id"].to_pylist(), rows["event_id"].to_pylist())))


def when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def generate_tis(client: CeleryClient, dag_id: str, run_id: str) -> list[dict]:
    return [t for t in client.task_instances(dag_id, run_id) if t["task_id"] == "generate"]


def span_seconds(tis: list[dict]) -> float:
    """From the first task instance's start to the last one's end."""
    return (max(when(t["end_date"]) for t in tis) - min(when(t["start_date"]) for t in tis)).total_seconds()


def report(scenario: str, **measures: Any) -> None:
    print(f"\ncelery: {scenario}: " + ", ".join(f"{k}={v}" for k, v in measures.items()))
