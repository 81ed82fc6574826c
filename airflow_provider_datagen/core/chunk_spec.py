"""ChunkSpec: the typed, versioned record a plan task hands each mapped task (one encoder, one decoder).

The plan task returns it as XCom (:meth:`ChunkSpec.to_xcom`, a plain JSON dict) and the map task
reads it back (:meth:`ChunkSpec.from_xcom`). The dict keeps the keys of the untyped descriptor the
previous versions wrote, plus :data:`FORMAT_KEY`; a dict without that key is such a descriptor,
read as format 1, so the XComs of a plan run before an upgrade stay readable by the map tasks after it.
See docs/adr/0022-typed-task-payloads.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_datagen.exceptions import ConfigurationError

#: The format this code writes; :meth:`ChunkSpec.from_xcom` refuses any other.
CHUNK_FORMAT = 1

#: The XCom key holding the format (absent from the descriptors written before it: format 1).
FORMAT_KEY = "chunk_format"

#: The fix every malformed-chunk error names.
_FIX = "pass expand_kwargs(plan.output) unchanged"


@dataclass(frozen=True)
class ChunkSpec:
    """One chunk of a plan: its experiment, the plan's choices, where its items are and which they are.

    Names and ids only, never an item's values, so the XCom stays small.
    """

    pipeline: str
    experiment: str
    processor_version: str
    #: ``"never"`` or ``"other_version"``: what the plan chose (see ``core.planner.plan_resume``)
    redo_completed: str
    #: an inline source's snapshot URI (``snapshot``) or the path source's path/URI
    source: str
    snapshot: bool
    key_field: str
    item_ids: tuple[str, ...]
    label: str
    index: int
    plan_log_version: int
    #: a path source's row ranges holding ``item_ids``: ``(start, stop)``, or ``(start, stop, byte
    #: offset)`` for JSONL (see ``core.source_scan.row_ranges``); None when the chunk names no rows
    rows: tuple[tuple[int, ...], ...] | None = None
    format: int = CHUNK_FORMAT

    def to_xcom(self) -> dict[str, Any]:
        """The JSON dict the plan task returns: the descriptor's keys (``rows`` only when set) and the format."""
        out: dict[str, Any] = {
            "pipeline": self.pipeline,
            "experiment": self.experiment,
            "processor_version": self.processor_version,
            "redo_completed": self.redo_completed,
            "source": self.source,
            "snapshot": self.snapshot,
            "key_field": self.key_field,
            "item_ids": list(self.item_ids),
            "label": self.label,
            "index": self.index,
            "plan_log_version": self.plan_log_version,
        }
        if self.rows is not None:
            out["rows"] = [list(r) for r in self.rows]
        out[FORMAT_KEY] = self.format
        return out

    @classmethod
    def from_xcom(cls, d: Any) -> ChunkSpec:
        """The spec of a plan's XCom dict; a dict without :data:`FORMAT_KEY` is a format-1 descriptor.

        :raises ConfigurationError: a format this code does not know (a newer provider planned it) or
            a field missing or of the wrong type, naming the field.
        """
        if isinstance(d, ChunkSpec):
            return d
        if not isinstance(d, Mapping):
            raise ConfigurationError(f"chunk {_shown(d)} is not a chunk dict; {_FIX}")
        version = d.get(FORMAT_KEY, 1)
        if version != CHUNK_FORMAT:
            raise ConfigurationError(
                f"chunk {FORMAT_KEY}={version!r} is not one this provider reads (it reads {CHUNK_FORMAT}): the "
                "plan task ran a newer airflow-provider-datagen; run the plan and map tasks on the same version"
            )
        rows = d.get("rows")
        return cls(
            pipeline=_field(d, "pipeline", str),
            experiment=_field(d, "experiment", str),
            processor_version=_field(d, "processor_version", str),
            # descriptors of the plans before redo_completed travelled in the chunk: the default then
            redo_completed=_field(d, "redo_completed", str, "never"),
            source=_field(d, "source", str),
            snapshot=bool(d.get("snapshot", False)),
            key_field=_field(d, "key_field", str, "id"),
            item_ids=tuple(_ids(d)),
            label=_field(d, "label", str, ""),
            index=_field(d, "index", int, 0),
            plan_log_version=_field(d, "plan_log_version", int, 0),
            rows=None if rows is None else _rows(rows),
        )

    def check_task(
        self, *, pipeline: str, experiment: str, processor_version: str | None, redo_completed: str | None = None
    ) -> None:
        """Refuse a task whose names or choices differ from the plan's (None: not given, the plan's is taken)."""
        for param, mine in (
            ("pipeline", pipeline),
            ("experiment", experiment),
            ("processor_version", processor_version),
            ("redo_completed", redo_completed),
        ):
            theirs = getattr(self, param)
            if mine is not None and theirs != mine:
                raise ConfigurationError(
                    f"{param} mismatch: the plan produced chunks for {param}={theirs!r} but this task has "
                    f"{param}={mine!r}; give DatagenPlanOperator and DatagenMapOperator the same {param}"
                )


_MISSING = object()

_KINDS = {str: "a string", int: "an int"}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:99] + "…"


def _field(d: Mapping[str, Any], name: str, kind: type, default: Any = _MISSING) -> Any:
    value = d.get(name, default)
    if value is _MISSING:
        raise ConfigurationError(f"chunk has no {name!r}; {_FIX}")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigurationError(f"chunk {name}={_shown(value)} is not {_KINDS[kind]}; {_FIX}")
    return value


def _ids(d: Mapping[str, Any]) -> list[str]:
    ids = d.get("item_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        # the message of the untyped reader this replaces, which a user may have searched for
        raise ConfigurationError(f"chunk has no item_ids list; {_FIX}")
    return ids


def _rows(rows: Any) -> tuple[tuple[int, ...], ...]:
    ok = isinstance(rows, list) and all(
        isinstance(r, (list, tuple)) and len(r) in (2, 3) and all(type(n) is int for n in r) for r in rows
    )
    if not ok:
        raise ConfigurationError(f"chunk rows={_shown(rows)} is not a list of [start, stop] ranges; {_FIX}")
    return tuple(tuple(r) for r in rows)
