"""What one ``run_items`` call did: :class:`RunReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_datagen.core.planner import ResumePlan


@dataclass
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

    def as_dict(self) -> dict[str, int]:
        return {
            "processed": len(self.processed),
            "skipped": len(self.skipped),
            "replayed": len(self.replayed),
            "failed": len(self.failed),
            "invocations": self.invocations,
        }
