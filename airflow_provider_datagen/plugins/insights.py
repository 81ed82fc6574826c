"""The experiment page's panels beyond counts: spend and budget, throughput over time, the next run.

Each is a plain JSON-able dict built from one log version (the app caches them with the fold):

* :func:`spend_panel`: what the log's usage ledger says was spent (total, by model, by failed
  attempts), the budget and what is left, and what the pending source items would cost at the mean
  observed per completed source item.
* :func:`throughput`: items completed and failed attempts per minute, from the ``created_at`` of the
  TERMINAL and FAILED rows (the time each row was written), with the geometry of a small inline SVG
  chart (no script, nothing fetched).
* :func:`open_batches`: the experiment's batch submissions still open (core/batch), with their age;
  read on every view (they change without a new log version), never cached.
* :func:`next_run`: what a rerun would touch now, in the planner's terms. A plan task records the
  source it read beside the log (``core/store/source_ref.py``); the panel classifies that source
  against the fold with the planner's own functions (fresh, replay, failed, edited, demoted, skip).
  Without a record (an older log, ``run_items`` outside a plan) or when the source cannot be read,
  it says so and counts what the log alone knows (replay, failed, the never-started items it holds,
  and the running items per processor version, which a rerun at another version demotes).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core import EventType, ItemStatus
from airflow_provider_datagen.core.next_run import rerun_counts, too_large_to_classify

if TYPE_CHECKING:
    from airflow_provider_datagen.core import CheckpointLog
    from airflow_provider_datagen.core.store.source_ref import SourceRef

logger = logging.getLogger(__name__)

#: Bars of the throughput chart at most; a longer run gets wider buckets (rates stay per minute).
MAX_BUCKETS = 120
#: The plot area of the chart; the axes, their ticks and titles sit in the margins around it.
CHART_WIDTH = 720
CHART_HEIGHT = 140
MAX_BAR = 14.0
#: Left, top, right and bottom margins of the chart (room for the tick labels and axis titles).
MARGINS = (52, 10, 16, 38)
#: Tick labels per axis at most (the y axis gets "nice" steps of 1, 2 or 5 times a power of ten).
MAX_TICKS = 6
_MINUTE_US = 60_000_000
_DAY_US = 24 * 60 * _MINUTE_US


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def spend_panel(usage: dict[str, Any], budget: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Spend, budget left and the estimate for the pending items (``usage``/``budget``: the log's contract)."""
    cost = float(usage.get("cost_usd") or 0.0)
    tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
    completed = int(summary.get("completed") or 0)
    pending = int(summary.get("pending") or 0)
    mean_cost = _ratio(cost, completed)
    mean_tokens = _ratio(tokens, completed)
    budget_usd = budget.get("budget_usd")
    budget_tokens = budget.get("budget_tokens")
    by_model = [
        {"model": model, **{k: v for k, v in row.items() if k != "model"}}
        for model, row in sorted((usage.get("by_model") or {}).items())
    ]
    # "requests" (every model request sent, failed ones included) is newer than the ledger's other
    # totals: None (not shown) on a ledger that does not count them.
    requests = usage.get("requests")
    reused = int(usage.get("reused_calls") or 0)
    return {
        "recorded": bool(usage.get("calls")) or bool(requests) or bool(reused),
        "calls": int(usage.get("calls") or 0),
        "requests": None if requests is None else int(requests),
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "tokens": tokens,
        "cost_usd": cost,
        "unpriced_calls": int(usage.get("unpriced_calls") or 0),
        "failed_attempts_cost_usd": float(usage.get("failed_attempts_cost_usd") or 0.0),
        # answers read from the response store (no request) and what they would have cost again
        "reused_calls": reused,
        "saved_usd": float(usage.get("saved_usd") or 0.0),
        "by_model": by_model,
        "budget_usd": budget_usd,
        "budget_tokens": budget_tokens,
        "left_usd": None if budget_usd is None else float(budget_usd) - cost,
        "left_tokens": None if budget_tokens is None else int(budget_tokens) - tokens,
        "completed": completed,
        "pending": pending,
        "mean_cost_usd": mean_cost,
        "mean_tokens": mean_tokens,
        "estimate_pending_usd": None if mean_cost is None else mean_cost * pending,
        "estimate_pending_tokens": None if mean_tokens is None else round(mean_tokens * pending),
    }


def throughput(event_log: CheckpointLog) -> dict[str, Any]:
    """Items completed and failed attempts per minute over the run, bucketed for a small chart."""
    flt = pc.field("event_type").isin([EventType.TERMINAL.value, EventType.FAILED.value])
    table = event_log.scan(["event_id", "event_type", "status", "created_at"], flt)
    empty = {"buckets": [], "bucket_minutes": 1, "start": None, "end": None, "completed": 0, "failures": 0}
    if not table.num_rows:
        return {**empty, "chart": None}
    # A retried append lands a batch twice with the same event ids; count each event once.
    table = table.group_by(["event_id", "event_type", "status"]).aggregate([("created_at", "min")])
    at = pc.cast(pc.cast(table["created_at_min"], pa.timestamp("us")), pa.int64()).to_numpy(zero_copy_only=False)
    is_failed = np.asarray(pc.equal(table["event_type"], EventType.FAILED.value).to_numpy(zero_copy_only=False))
    is_done = (
        np.asarray(
            pc.fill_null(pc.equal(table["status"], ItemStatus.COMPLETED.value), False).to_numpy(zero_copy_only=False)
        )
        & ~is_failed
    )
    start = int(at.min()) // _MINUTE_US * _MINUTE_US
    end = int(at.max())
    minutes = (end - start) // _MINUTE_US + 1
    width = max(1, math.ceil(minutes / MAX_BUCKETS))
    n = math.ceil(minutes / width)
    index = (at - start) // (_MINUTE_US * width)
    done = np.bincount(index[is_done], minlength=n)[:n]
    failed = np.bincount(index[is_failed], minlength=n)[:n]
    buckets = [
        {
            "start": _iso_us(start + i * width * _MINUTE_US),
            "completed_per_minute": float(done[i]) / width,
            "failures_per_minute": float(failed[i]) / width,
        }
        for i in range(n)
    ]
    out = {
        "buckets": buckets,
        "bucket_minutes": width,
        "start": _iso_us(start),
        "end": _iso_us(end),
        "completed": int(done.sum()),
        "failures": int(failed.sum()),
    }
    return {**out, "chart": _chart(buckets, start, width)}


def _iso_us(us: int) -> str:
    return str(np.datetime64(us, "us")) + "Z"


def _nice_step(peak: float) -> float:
    """A step of 1, 2 or 5 times a power of ten giving at most :data:`MAX_TICKS` - 1 steps up to ``peak``."""
    raw = peak / (MAX_TICKS - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * power >= raw:
            return m * power
    return 10.0 * power  # pragma: no cover - the loop ends at 10


def _rate_label(value: float) -> str:
    return f"{value:g}"


def _y_ticks(peak: float) -> tuple[float, list[dict[str, Any]]]:
    """The y axis' top (a whole number of steps at or above ``peak``) and its labelled ticks."""
    step = _nice_step(peak)
    steps = max(1, math.ceil(peak / step - 1e-9))
    top = steps * step
    ticks = [
        {"y": round(CHART_HEIGHT - CHART_HEIGHT * i / steps, 2), "label": _rate_label(round(i * step, 9))}
        for i in range(steps + 1)
    ]
    return top, ticks


def _x_ticks(n: int, start: int, width: int, span_us: int) -> list[dict[str, Any]]:
    """Labelled ticks at bucket edges, at most :data:`MAX_TICKS` + 1, in UTC (with the date on a long run).

    The last edge (the end of the last bucket) is ticked when the step lands on it, so a run of one
    minute shows where its minute starts and ends.
    """
    every = max(1, math.ceil(n / MAX_TICKS))
    step = CHART_WIDTH / n
    fmt = "%m-%d %H:%M" if span_us >= _DAY_US else "%H:%M"
    ticks = []
    for i in range(0, n + 1, every):
        at = np.datetime64(start + i * width * _MINUTE_US, "us").astype(object)
        ticks.append({"x": round(i * step, 2), "label": at.strftime(fmt)})
    return ticks


def _chart(buckets: list[dict[str, Any]], start: int, width: int) -> dict[str, Any]:
    """The geometry of the chart: one bar pair per bucket and the two axes, scaled to a nice top rate.

    Coordinates of bars and ticks are in the plot area (its origin at ``margin.left``/``margin.top``).
    """
    peak = max(max(b["completed_per_minute"], b["failures_per_minute"]) for b in buckets) or 1.0
    top, y_ticks = _y_ticks(peak)
    step = CHART_WIDTH / len(buckets)
    # two bars per bucket, side by side and centred; a run of a few minutes keeps thin bars
    bar = min(MAX_BAR, max(1.0, step / 2 - 0.5))
    bars = []
    for i, b in enumerate(buckets):
        x = i * step + (step - 2 * bar) / 2
        for kind, rate, dx in (
            ("completed", b["completed_per_minute"], 0.0),
            ("failed", b["failures_per_minute"], bar),
        ):
            if not rate:
                continue
            h = max(1.0, CHART_HEIGHT * rate / top)
            title = f"{b['start']}: {rate:g} {kind} per minute"
            bars.append(
                {"kind": kind, "x": round(x + dx, 2), "y": round(CHART_HEIGHT - h, 2), "w": round(bar, 2)}
                | {"h": round(h, 2), "title": title}
            )
    left, top_margin, right, bottom = MARGINS
    span = len(buckets) * width * _MINUTE_US
    return {
        "width": CHART_WIDTH + left + right,
        "height": CHART_HEIGHT + top_margin + bottom,
        "plot": {"left": left, "top": top_margin, "width": CHART_WIDTH, "height": CHART_HEIGHT},
        "peak": peak,
        "y_max": top,
        "bars": bars,
        "x_ticks": _x_ticks(len(buckets), start, width, span),
        "y_ticks": y_ticks,
        "x_title": "time (UTC)" + (f", bars of {width} minutes" if width > 1 else ""),
        "y_title": "per minute",
    }


def next_run(
    states: pa.Table,
    summary: dict[str, Any],
    source: SourceRef | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What a rerun would touch now: the recorded source classified against ``states``, and the log-only view.

    ``classes`` holds the planner's counts over the source the last plan recorded (None without a
    record, when the source cannot be read: ``unreachable`` then says why, or when it is a path source
    too large to classify in the API server: ``not_classified`` says so); the other counts are
    what the log alone knows, over the source items it holds.
    """
    failed = int(summary.get("failed_items") or 0)
    running = int(summary.get("running") or 0)
    by_version: dict[str, int] = {}
    if states.num_rows:
        roots = states.filter(pc.equal(states["depth"], 0))
        inbox = roots.filter(pc.equal(roots["status"], ItemStatus.RUNNING.value))
        if inbox.num_rows:
            for entry in pc.value_counts(inbox["processor_version"]).to_pylist():
                version = entry["values"]
                by_version["(none)" if version is None else str(version)] = int(entry["counts"])
    out: dict[str, Any] = {
        "replay": running - failed,
        "failed": failed,
        "never_started": int(summary.get("never_started") or 0),
        "done": int(summary.get("completed") or 0) + int(summary.get("filtered") or 0),
        "running_by_version": dict(sorted(by_version.items())),
        "source_known": source is not None,
        "source": None if source is None else source.as_dict(),
        "classes": None,
        "unreachable": None,
        "not_classified": None,
    }
    if source is None:
        return out
    out["not_classified"] = too_large_to_classify(source)
    if out["not_classified"]:
        return out
    try:
        counts = rerun_counts(source, states, int(summary.get("log_version") or 0), storage_options)
    except Exception as exc:  # any reason a source cannot be read (gone, no credentials, changed schema)
        # the page must still show; the reason goes to the panel and the API server's log
        logger.warning("next-run panel: the recorded source %s cannot be read: %s", source.uri, exc)
        out["unreachable"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return out
    out["classes"] = counts.as_dict()
    return out


def open_batches(event_log: CheckpointLog, now: float | None = None) -> list[dict[str, Any]]:
    """The open batch submissions of the experiment, oldest first, each with a readable ``age``."""
    # Deferred: most experiments never run a batch, and the page must not fail on this panel.
    from airflow_provider_datagen.core.store import batches

    now = time.time() if now is None else now
    out = []
    for sub in batches.open_submissions(event_log):
        seconds = max(0.0, now - sub.intent_at)
        age = (
            f"{seconds / 3600:.1f} h"
            if seconds >= 3600
            else f"{seconds / 60:.0f} min"
            if seconds >= 60
            else f"{seconds:.0f} s"
        )
        out.append({**sub.describe(), "age": age, "age_seconds": seconds})
    return out
