"""crash_resume_equivalent with real processes: SIGKILL a worker mid-run, resume, compare with a clean run.

Each schedule runs ``tests/_support/workers/crash.py`` in a subprocess that kills itself with SIGKILL
at a chosen point (after K invocations, after the K-th commit, just before it, right after an inbox
pull, right after a side effect), possibly twice in a row; then the test resumes in-process and
compares the export with an uninterrupted run of the same deterministic pipeline in another
experiment. Between the kill and the resume it checks ``done_marker_implies_output_readable``: every
item the log calls done has its full output. Schedules come from a seeded generator, so a failure
names a reproducible schedule.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.export import collect_results
from tests._support import REPO
from tests._support.engine import (
    Recorder,
    append_line,
    build_pipeline,
    dedupe_receiver,
    make_items,
    open_log,
    read_emissions,
    results_fp,
    statuses,
)

if TYPE_CHECKING:
    from pathlib import Path

# every schedule's worker is a fresh interpreter: `make test` runs them, `make unit` (the inner loop) leaves them out
pytestmark = pytest.mark.slow

SEED = 20261130
N_SCHEDULES = 20


@dataclass(frozen=True)
class Kill:
    mode: str
    after: int


@dataclass
class Schedule:
    name: str
    kind: str
    n: int
    every: int | None
    kills: list[Kill]
    outcomes: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        kills = ", ".join(f"{k.mode}@{k.after}" for k in self.kills)
        return f"{self.name}: kind={self.kind} n={self.n} every={self.every} kills=[{kills}]"


def worker_cmd(root: Path, experiment: str, s: Schedule, kill: Kill | None, **extra: Any) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "tests._support.workers.crash",
        "--root",
        str(root),
        "--experiment",
        experiment,
        "--n-items",
        str(s.n),
        "--checkpoint-every",
        "none" if s.every is None else str(s.every),
        "--kind",
        s.kind,
    ]
    if kill is not None:
        cmd += ["--kill-mode", kill.mode, "--kill-after", str(kill.after)]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def run_worker(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), RUST_LOG="error")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


class Baselines:
    """Uninterrupted in-process runs: results per (kind, n); commits and leaf calls per (kind, n, every)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[Any, ...], Any] = {}

    def totals(self, kind: str, n: int, every: int | None) -> tuple[dict[str, str], int, int]:
        key = (kind, n, every)
        if key not in self._cache:
            log = open_log(self.root, f"base-{kind}-{n}-{every}")
            rec = Recorder()
            report = run_items(
                log, make_items(n), build_pipeline(kind, rec), checkpoint_every=every, checkpoint_interval=3600
            )
            self._cache[key] = (collect_results(log), report.commits, len(rec.calls))
        return self._cache[key]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: Any) -> Baselines:
    return Baselines(tmp_path_factory.mktemp("crash-baselines"))


def random_schedules(baselines: Baselines) -> list[Schedule]:
    rng = random.Random(SEED)
    out = []
    for i in range(N_SCHEDULES):
        kind = rng.choice(["flat", "flat", "steps"])
        n = rng.randint(3, 6) if kind == "steps" else rng.randint(4, 24)
        every = rng.choice([1, 2, 3, 5, None])
        _, commits, calls = baselines.totals(kind, n, every)
        kills = []
        for _ in range(rng.choice([1, 1, 1, 2])):
            mode = rng.choice(["invocation", "commit", "before-commit", "pull"])
            after = {
                "invocation": rng.randint(0, max(calls - 1, 0)),
                "commit": rng.randint(1, max(commits - 1, 1)),
                "before-commit": rng.randint(1, commits),
                "pull": 1,
            }[mode]
            kills.append(Kill(mode, after))
        out.append(Schedule(f"schedule-{i:02d}", kind, n, every, kills))
    return out


def check_after_kill(log: Any, expected: dict[str, str], where: str) -> set[str]:
    """done_marker_implies_output_readable; returns the root items done so far."""
    done = set()
    results = collect_results(log)
    for iid, status in statuses(log).items():
        if "/" in iid or status != "completed":
            continue
        done.add(iid)
        assert results.get(iid) == expected[iid], f"{where}: item {iid} is done without its output"
    return done


BOUNDARIES = [
    # Killed between the pull commit and the first ack: everything is in the inbox, nothing acked.
    ("flat", 10, None, Kill("pull", 1), 0),
    ("flat", 10, 3, Kill("pull", 1), 0),
    ("steps", 4, 1, Kill("pull", 1), 0),
    # Second pull of a 70-item source at checkpoint_every=1: the first 64 are acked, 6 in the inbox.
    ("flat", 70, 1, Kill("pull", 2), 64),
    # On the first invocation of a group (the previous group just acked).
    ("flat", 12, 3, Kill("invocation", 6), 6),
    ("flat", 12, 4, Kill("invocation", 4), 4),
    # Just before an ack commit lands (commit 1 is the pull) and just after it.
    ("flat", 12, 4, Kill("before-commit", 2), 0),
    ("flat", 12, 4, Kill("commit", 2), 4),
]
EMITS = [("flat", None, 5), ("steps", 1, 9)]


@dataclass
class Killed:
    root: Path
    schedules: dict[str, Schedule]
    emit_files: dict[str, Path]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: Any, baselines: Baselines) -> Killed:
    """Every subprocess of this module, run three at a time: the expensive part is interpreter start-up."""
    root = tmp_path_factory.mktemp("crash-runs")
    schedules = {s.name: s for s in random_schedules(baselines)}
    for i, (kind, n, every, kill, _) in enumerate(BOUNDARIES):
        schedules[f"boundary-{i}"] = Schedule(f"boundary-{i}", kind, n, every, [kill])
    emit_files = {}
    for i, (kind, every, after) in enumerate(EMITS):
        name = f"emit-{i}"
        n = 4 if kind == "steps" else 8
        schedules[name] = Schedule(name, kind, n, every, [Kill("emit", after)])
        emit_files[name] = root / f"{name}.tsv"

    def execute(s: Schedule) -> None:
        extra = {"emit_file": emit_files[s.name]} if s.name in emit_files else {}
        for kill in s.kills:
            proc = run_worker(worker_cmd(root, s.name, s, kill, **extra))
            s.outcomes.append(proc.returncode)
            assert proc.returncode in (0, -signal.SIGKILL), f"{s}: worker failed\n{proc.stderr[-3000:]}"

    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(execute, schedules.values()))
    return Killed(root, schedules, emit_files)


def test_the_random_schedules_really_kill(killed: Killed) -> None:
    randoms = [s for name, s in killed.schedules.items() if name.startswith("schedule-")]
    assert len(randoms) == N_SCHEDULES
    assert sum(rc == -signal.SIGKILL for s in randoms for rc in s.outcomes) >= N_SCHEDULES
    assert {k.mode for s in randoms for k in s.kills} == {"invocation", "commit", "before-commit", "pull"}
    assert {s.every for s in randoms} == {1, 2, 3, 5, None}


@pytest.mark.parametrize("index", range(N_SCHEDULES))
def test_crash_resume_equivalent_after_sigkill(killed: Killed, baselines: Baselines, index: int) -> None:
    s = killed.schedules[f"schedule-{index:02d}"]
    expected, _, _ = baselines.totals(s.kind, s.n, s.every)
    log = open_log(killed.root, s.name)
    acked = check_after_kill(log, expected, str(s))
    rec = Recorder()
    report = run_items(
        log, make_items(s.n), build_pipeline(s.kind, rec), checkpoint_every=s.every, epoch=log.next_epoch()
    )
    assert not acked & {c.split("/")[0] for c in rec.calls}, f"{s}: an acked item was invoked again"
    assert sorted(report.skipped) == sorted(acked), str(s)
    assert collect_results(log) == expected, str(s)
    assert results_fp(log) == results_fp(open_log(baselines.root, f"base-{s.kind}-{s.n}-{s.every}")), str(s)
    assert log.summary()["pending"] == 0


@pytest.mark.parametrize(
    "index", range(len(BOUNDARIES)), ids=[f"{b[0]}-n{b[1]}-every{b[2]}-{b[3].mode}@{b[3].after}" for b in BOUNDARIES]
)
def test_kill_at_pull_and_ack_boundaries(killed: Killed, baselines: Baselines, tmp_path: Path, index: int) -> None:
    kind, n, every, _, acked_after_kill = BOUNDARIES[index]
    s = killed.schedules[f"boundary-{index}"]
    assert s.outcomes == [-signal.SIGKILL]
    expected, _, _ = baselines.totals(kind, n, every)
    log = open_log(killed.root, s.name)
    acked = check_after_kill(log, expected, str(s))
    assert len(acked) == acked_after_kill
    roots = {i: v for i, v in statuses(log).items() if "/" not in i}
    assert all(v == "running" for i, v in roots.items() if i not in acked)  # the rest sits in the inbox
    rec = Recorder()
    report = run_items(log, make_items(n), build_pipeline(kind, rec), checkpoint_every=every, epoch=log.next_epoch())
    # The inbox drains first, in source order.
    inbox = [str(i) for i in range(n) if str(i) in roots and str(i) not in acked]
    assert report.replayed == inbox
    if kind == "flat":
        assert rec.calls[: len(inbox)] == inbox
    assert collect_results(log) == expected
    got = export_results(log, str(tmp_path / "resumed.lance"))
    clean = export_results(open_log(baselines.root, f"base-{kind}-{n}-{every}"), str(tmp_path / "clean.lance"))
    assert got == clean


@pytest.mark.parametrize("index", range(len(EMITS)), ids=[f"{e[0]}-every{e[1]}-after{e[2]}" for e in EMITS])
def test_replay_dedupes_emissions_after_sigkill(
    killed: Killed, baselines: Baselines, tmp_path: Path, index: int
) -> None:
    """Killed after an emission and before its ack: the replay re-emits under the same idempotency key."""
    kind, every, after = EMITS[index]
    s = killed.schedules[f"emit-{index}"]
    assert s.outcomes == [-signal.SIGKILL]
    emit_file = killed.emit_files[s.name]
    assert len(read_emissions(emit_file)) == after
    clean_file = tmp_path / "clean.tsv"
    run_items(
        open_log(tmp_path, "clean"),
        make_items(s.n),
        build_pipeline(kind, emit=lambda k, p: append_line(clean_file, k, p)),
        checkpoint_every=every,
    )
    log = open_log(killed.root, s.name)
    run_items(
        log,
        make_items(s.n),
        build_pipeline(kind, emit=lambda k, p: append_line(emit_file, k, p)),
        checkpoint_every=every,
        epoch=log.next_epoch(),
    )
    raw = read_emissions(emit_file)
    clean = read_emissions(clean_file)
    assert len(raw) > len(clean)  # the crash really made the replay emit twice
    assert dedupe_receiver(raw) == dedupe_receiver(clean)  # and the receiver ends as after a clean run
    assert len(dedupe_receiver(clean)) == len(clean)
    assert collect_results(log) == baselines.totals(kind, s.n, every)[0]


def test_parent_sigkills_the_worker_after_a_random_delay(tmp_path: Path, baselines: Baselines) -> None:
    rng = random.Random(SEED + 1)
    env = dict(os.environ, PYTHONPATH=str(REPO), RUST_LOG="error")
    for attempt in range(2):
        s = Schedule(f"delay-{attempt}", "flat", 40, rng.choice([1, 4, None]), [])
        proc = subprocess.Popen(
            worker_cmd(tmp_path, s.name, s, None, sleep_ms=8),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        log = open_log(tmp_path, s.name)
        deadline = time.monotonic() + 60
        while not log.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)  # wait for the first commit, then kill at a random moment of the run
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        expected, _, _ = baselines.totals("flat", 40, s.every)
        acked = check_after_kill(log, expected, str(s))
        rec = Recorder()
        run_items(log, make_items(40), build_pipeline("flat", rec), checkpoint_every=s.every, epoch=log.next_epoch())
        assert not acked & set(rec.calls)
        assert collect_results(log) == expected


def test_worker_without_a_kill_reports_and_matches_the_baseline(tmp_path: Path, baselines: Baselines) -> None:
    s = Schedule("plain", "steps", 3, 2, [])
    proc = run_worker(worker_cmd(tmp_path, s.name, s, None))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["killed"] is False and report["processed"] == 3
    assert collect_results(open_log(tmp_path, s.name)) == baselines.totals("steps", 3, 2)[0]
