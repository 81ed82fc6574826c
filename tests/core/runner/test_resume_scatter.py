"""Seed 004's Scatter Resume scenario, ported: the Cartographer's per-region insights survive an abort.

40 source events of five kinds stream through ``run_items``; an export folds the completed items into
a per-region insights accumulator. The baseline runs uninterrupted; the interrupted run aborts after 8
completions (a BaseException from the process function, the seed's AbortController) and a resumed run
finishes the rest. The resumed insights fingerprint must equal the baseline's, the shipment counts must
agree, and over both runs every event must have been processed exactly once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from airflow_provider_datagen.core import canonical_json, export_results, plan_resume, run_items
from tests._support.engine import fields_of_export, open_log

RESUME_EVENT_COUNT = 40
ABORT_AFTER_ITEMS = 8
KINDS = ("position-ping", "facility-scan", "sensor-reading", "customs-event", "delivery-confirmation")
REGIONS = (("EU", "DE", "FRA"), ("EU", "FR", "CDG"), ("NA", "US", "ORD"), ("APAC", "SG", "SIN"))
SIZE_TIERS = ("envelope", "small", "medium", "large", "freight")
INSIGHT_FIELDS = (
    "deliveries",
    "exceptions",
    "onTimeCount",
    "lateCount",
    "totalSubtotalUsdMinor",
    "totalShippingUsdMinor",
    "totalDistanceKm",
    "totalDelayHours",
    "consentValid",
    "consentMissing",
    "consentExpired",
    "sizeTierEnvelope",
    "sizeTierSmall",
    "sizeTierMedium",
    "sizeTierLarge",
    "sizeTierFreight",
    "shipmentCount",
)


class AbortRun(BaseException):
    """The seed's AbortController firing mid-scatter: not an item error, it ends the run."""


def source_events() -> list[dict[str, Any]]:
    """Deterministic stream: kinds interleave so every kind is pulled before and after the abort."""
    events = []
    for i in range(RESUME_EVENT_COUNT):
        region, country, hub = REGIONS[(i * 3) % len(REGIONS)]
        events.append(
            {
                "eventId": f"evt-{i:03d}",
                "kind": KINDS[i % len(KINDS)],
                "shipmentId": f"shp-{i // 2:03d}",
                "region": region,
                "country": country,
                "hub": hub,
                "distanceKm": round(12.5 + (i * 37) % 400 / 4, 2),
                "delayHours": (i * 5) % 7,
                "subtotalUsdMinor": 1000 + (i * 733) % 9000,
                "shippingUsdMinor": 250 + (i * 91) % 1200,
                "consent": ("valid", "missing", "expired")[i % 3],
                "sizeTier": SIZE_TIERS[(i * 7) % len(SIZE_TIERS)],
                "promisedHours": 48,
                "actualHours": 30 + (i * 11) % 40,
                "temperatureC": -2 + (i * 13) % 12,
            }
        )
    return events


def aggregate_event(event: dict[str, Any]) -> dict[str, Any]:
    """The scatter body: one event's contribution to its region's insights (a pure function)."""
    c = dict.fromkeys(INSIGHT_FIELDS, 0)
    kind = event["kind"]
    if kind == "position-ping":
        c["totalDistanceKm"] = event["distanceKm"]
    elif kind == "facility-scan":
        c["exceptions"] = int(event["delayHours"] > 4)
        c["totalDelayHours"] = event["delayHours"]
    elif kind == "sensor-reading":
        c["exceptions"] = int(not 0 <= event["temperatureC"] <= 8)
    elif kind == "customs-event":
        c["totalDelayHours"] = event["delayHours"]
        c["consent" + event["consent"].capitalize()] = 1
    else:  # delivery-confirmation
        on_time = event["actualHours"] <= event["promisedHours"]
        c.update(
            deliveries=1,
            onTimeCount=int(on_time),
            lateCount=int(not on_time),
            totalSubtotalUsdMinor=event["subtotalUsdMinor"],
            totalShippingUsdMinor=event["shippingUsdMinor"],
            shipmentCount=1,
        )
        c["sizeTier" + event["sizeTier"].capitalize()] = 1
    return {"region": event["region"], "country": event["country"], "hub": event["hub"], "contribution": c}


def insights_from_export(dest: str) -> dict[str, dict[str, Any]]:
    """Gather: fold the exported per-event contributions into per-region insights (a commutative monoid)."""
    insights: dict[str, dict[str, Any]] = {}
    for f in fields_of_export(dest).values():
        key = f"{f['region']}|{f['country']}|{f['hub']}"
        acc = insights.setdefault(key, {"region": f["region"], "country": f["country"], "hub": f["hub"]})
        for name, value in f["contribution"].items():
            acc[name] = round(acc.get(name, 0) + value, 6)
    return insights


def insights_fingerprint(insights: dict[str, dict[str, Any]]) -> str:
    return canonical_json([insights[k] for k in sorted(insights)])


class Cartographer:
    """The process function, counting completed invocations per event; optionally aborting."""

    def __init__(self, abort_after: int | None = None) -> None:
        self.abort_after = abort_after
        self.completed: Counter[str] = Counter()
        self.attempted: list[str] = []

    def __call__(self, item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        self.attempted.append(ctx.item_id)
        if self.abort_after is not None and sum(self.completed.values()) >= self.abort_after:
            raise AbortRun(f"abort after {self.abort_after} aggregate-event completions")
        out = aggregate_event(item)
        self.completed[ctx.item_id] += 1
        return out


@pytest.mark.parametrize("every", [1, 4, None])
def test_scatter_resume_is_exactly_once(tmp_path: Any, every: int | None) -> None:
    events = source_events()
    assert Counter(e["kind"] for e in events) == dict.fromkeys(KINDS, 8)

    # Baseline: a full streaming pass with no abort.
    base_log = open_log(tmp_path, "baseline", pipeline="cartographer")
    baseline = Cartographer()
    run_items(base_log, events, baseline, key_field="eventId", checkpoint_every=every)
    export_results(base_log, str(tmp_path / "baseline.lance"))
    base_insights = insights_from_export(str(tmp_path / "baseline.lance"))
    assert len(base_insights) == len(REGIONS)

    # Step A: interrupted run, abort after 8 completions.
    log = open_log(tmp_path, "resume", pipeline="cartographer")
    first = Cartographer(abort_after=ABORT_AFTER_ITEMS)
    with pytest.raises(AbortRun):
        run_items(log, events, first, key_field="eventId", checkpoint_every=every, reraise=(AbortRun,), epoch=1)
    summary = log.summary()
    assert summary["completed"] == ABORT_AFTER_ITEMS  # the durable cursor: 8 acked
    assert summary["running"] == RESUME_EVENT_COUNT - ABORT_AFTER_ITEMS  # pulled into the inbox, not acked
    interrupted = first.attempted[-1]
    assert interrupted == "evt-008"

    # Step B: resume drains the inbox (starting with the interrupted item) and skips the acked ones.
    plan = plan_resume(log, events, key_field="eventId")
    assert len(plan.skip) == ABORT_AFTER_ITEMS and plan.replay[0] == interrupted
    second = Cartographer()
    report = run_items(log, events, second, key_field="eventId", checkpoint_every=every, epoch=log.next_epoch())
    assert report.replayed[0] == interrupted
    assert len(report.processed) == RESUME_EVENT_COUNT - ABORT_AFTER_ITEMS
    assert log.summary()["pending"] == 0

    # Exactly once: the union of both runs' invocations covers every event once.
    assert not set(first.completed) & set(second.completed)
    union = first.completed + second.completed
    assert union == Counter({e["eventId"]: 1 for e in events})
    assert union == baseline.completed

    # Proof: the resumed insights fingerprint equals the baseline's.
    result = export_results(log, str(tmp_path / "resumed.lance"))
    resumed = insights_from_export(str(tmp_path / "resumed.lance"))
    assert insights_fingerprint(resumed) == insights_fingerprint(base_insights)
    assert result == {**export_results(base_log, str(tmp_path / "baseline.lance")), "changed": True}
    # Shipment-count cross-check (gross undercount / double-count guard).
    total = sum(r["shipmentCount"] for r in resumed.values())
    assert total == sum(r["shipmentCount"] for r in base_insights.values()) == 8


def test_insights_accumulator_is_partition_free(tmp_path: Any) -> None:
    """The gather is a commutative monoid, so folding chunks in any order gives the same insights."""
    events = source_events()
    whole = open_log(tmp_path, "whole", pipeline="cartographer")
    run_items(whole, events, Cartographer(), key_field="eventId")
    export_results(whole, str(tmp_path / "whole.lance"))
    chunks = [events[i::3] for i in range(3)]
    parts = []
    for i, chunk in enumerate(reversed(chunks)):
        lg = open_log(tmp_path, f"part{i}", pipeline="cartographer")
        run_items(lg, chunk, Cartographer(), key_field="eventId", writer_id=f"w{i}")
        export_results(lg, str(tmp_path / f"part{i}.lance"))
        parts.append(insights_from_export(str(tmp_path / f"part{i}.lance")))
    merged: dict[str, dict[str, Any]] = {}
    for part in parts:
        for key, acc in part.items():
            into = merged.setdefault(key, {k: acc[k] for k in ("region", "country", "hub")})
            for name in INSIGHT_FIELDS:
                into[name] = round(into.get(name, 0) + acc.get(name, 0), 6)
    assert insights_fingerprint(merged) == insights_fingerprint(insights_from_export(str(tmp_path / "whole.lance")))
