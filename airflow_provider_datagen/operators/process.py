"""``process=``: a callable, a step pipeline or a ``"package.module:function"`` path, resolved on the worker."""

from __future__ import annotations

import importlib
import re
from typing import Any

from airflow_provider_datagen._arguments import (
    bad_argument,
)

PROCESS_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def bad_process(process: Any) -> Exception:
    return bad_argument(
        "DatagenMapOperator",
        "process",
        process,
        "is not a callable, a Step pipeline or a 'package.module:function' path",
        "pass the function or pipeline itself, or its dotted path",
    )


def resolve_process(process: Any) -> Any:
    """A callable or Step from ``"package.module:function"``, a callable or a step pipeline."""
    # Deferred, like every core import here: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.steps import Step

    if isinstance(process, Step) or callable(process):
        return process
    if not isinstance(process, str) or not PROCESS_PATH_RE.match(process):
        raise bad_process(process)
    obj = import_path("DatagenMapOperator", process)
    if not (isinstance(obj, Step) or callable(obj)):
        raise bad_argument(
            "DatagenMapOperator",
            "process",
            process,
            f"is a {type(obj).__name__}, not a callable or a Step",
            "point it at a function or a step pipeline",
        )
    return obj


def import_path(owner: object, process: str) -> Any:
    """The object a ``"package.module:name"`` path names, imported now (on the worker); errors name ``owner``."""
    module_name, _, attr = process.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise bad_argument(
            owner,
            "process",
            process,
            f"names a module it cannot import: module {module_name!r} ({exc})",
            "make it importable on the workers (a package, or a module next to the DAG file)",
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise bad_argument(
                owner,
                "process",
                process,
                f"names a missing attribute: module {module_name!r} has no attribute {attr!r}",
                "check the name after the ':'",
            )
        obj = getattr(obj, part)
    return obj
