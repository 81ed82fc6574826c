"""Argument checks of the Airflow layer, with one message form for every bad argument.

``<Class>: <param>=<value!r> <problem>; <fix>``, raised as
:class:`~airflow_provider_datagen.exceptions.ConfigurationError` by operators, sensors and triggers
(at DAG parse time where the value is known then, else when the task runs after templating).
"""

from __future__ import annotations

import os
from typing import Any

from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.exceptions import DatagenError, bad_argument


def is_template(value: Any) -> bool:
    """Whether ``value`` is a Jinja template string, checked only once rendered (in ``execute``)."""
    return isinstance(value, str) and "{{" in value


def check_absolute_path(owner: object, param: str, value: Any) -> Any:
    """A local path must be absolute (each Airflow component runs in its own working directory); URIs,
    templates and non-path values pass unchanged (other checks own those)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and not is_template(value) and not has_scheme(value) and not os.path.isabs(value):
        raise bad_argument(
            owner,
            param,
            value,
            "is a relative path",
            "give an absolute path or a URI (each Airflow component has its own working directory)",
        )
    return value


def check_name_argument(owner: object, param: str, value: Any) -> Any:
    """A pipeline or experiment name as given; a template is left for after rendering."""
    # Deferred: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.ids import check_name

    if is_template(value):
        return value
    try:
        return check_name(value, param)
    except DatagenError as exc:
        raise bad_argument(owner, param, value, "is not a valid name", str(exc)) from None


def check_positive_int(owner: object, param: str, value: Any, *, allow_none: bool = False) -> Any:
    """``value`` if it is an int of 1 or more (or ``None`` when allowed); bools are refused."""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fix = f"give {param} an int of 1 or more" + (" or None" if allow_none else "")
        raise bad_argument(owner, param, value, "is not a positive int", fix)
    return value


def check_non_empty_str(owner: object, param: str, value: Any, fix: str) -> str:
    """``value`` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise bad_argument(owner, param, value, "is not a non-empty string", fix)
    return value
