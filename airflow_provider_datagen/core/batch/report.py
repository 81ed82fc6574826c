"""BatchReport: what a batch run did (``run_batch``'s return value, :class:`~.run.BatchRun`'s report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_datagen.core.runner.report import RunReport


@dataclass(repr=False)
class BatchReport(RunReport):
    """What a batch run did: :class:`RunReport`'s lists, plus the batches it submitted or re-attached to."""

    #: the provider's ids of every batch this run submitted, re-attached to or polled, in order
    batches: list[str] = field(default_factory=list)
    #: items submitted and not yet back when it returned (0 after :func:`run_batch`)
    in_batch: int = 0

    def as_dict(self) -> dict[str, Any]:  # two more keys
        return {**super().as_dict(), "batches": list(self.batches), "in_batch": self.in_batch}

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", batches={len(self.batches)}, in_batch={self.in_batch})"
