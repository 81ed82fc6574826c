"""What one ``run_items`` call did: :class:`RunReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_datagen.core.planner import ResumePlan


#: How many failed item ids the repr names; the lists themselves stay complete.
REPR_FAILED_IDS = 3


@dataclass(repr=False)
class RunReport:
    """What one ``run_items`` call did. Lists hold item ids in processing order."""

    processed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    invocations: int = 0
    commits: int = 0
    events: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    plan: ResumePlan | None = None
    #: the budget was reached: no new item started after it, the rest stays pending
    stopped_by_budget: bool = False

    def as_dict(self) -> dict[str, int]:
        return {
            "processed": len(self.processed),
            "skipped": len(self.skipped),
            "replayed": len(self.replayed),
            "failed": len(self.failed),
            "invocations": self.invocations,
        }

    def __repr__(self) -> str:
        """Counts, and the first few failed ids: the dataclass default printed every id (and the plan)."""
        failed = ", ".join(repr(i) for i in self.failed[:REPR_FAILED_IDS])
        if len(self.failed) > REPR_FAILED_IDS:
            failed += ", ..."
        return (
            f"RunReport(processed={len(self.processed)}, skipped={len(self.skipped)}, "
            f"replayed={len(self.replayed)}, failed={len(self.failed)}"
            + (f" [{failed}]" if failed else "")
            + f", invocations={self.invocations}, commits={self.commits}, events={self.events}"
            + (", stopped_by_budget=True)" if self.stopped_by_budget else ")")
        )
