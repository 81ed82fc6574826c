"""RunReport's repr is short: counts and a few failed ids, whatever the run's size."""

from __future__ import annotations

from airflow_provider_datagen.core.runner.report import RunReport


def test_repr_shows_counts_and_at_most_three_failed_ids() -> None:
    ids = [f"item-{i:05d}" for i in range(10_000)]
    report = RunReport(
        processed=ids[:9_000], skipped=ids[9_000:], failed=ids[:5], invocations=9_000, commits=3, events=45_000
    )
    assert repr(report) == (
        "RunReport(processed=9000, skipped=1000, replayed=0, failed=5 ['item-00000', 'item-00001', "
        "'item-00002', ...], invocations=9000, commits=3, events=45000)"
    )
    assert repr(RunReport(processed=["a"], invocations=1)) == (
        "RunReport(processed=1, skipped=0, replayed=0, failed=0, invocations=1, commits=0, events=0)"
    )
    assert repr(RunReport(failed=["x", "y"])).count("'") == 4  # both ids, no ellipsis
    assert "..." not in repr(RunReport(failed=["x", "y", "z"]))
