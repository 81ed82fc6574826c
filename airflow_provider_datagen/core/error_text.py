"""The text of an exception raised by user code, whatever its ``__str__`` and ``__repr__`` do.

Every place that records or reports an error of the user's process (its FAILED row, the run's
report, a log line, the errors that stop a chunk) formats it here: an SDK error that formats a
malformed body may raise from ``__str__`` or return something that is not a string, and that must
fail only its item, never the run that records it.
"""

from __future__ import annotations

import traceback as tb_module


def error_type(exc: BaseException) -> str:
    """The exception's class name (``"<unnamed exception>"`` if even that cannot be read)."""
    try:
        name = type(exc).__name__
    except Exception:  # a metaclass may break anything
        return "<unnamed exception>"
    return name if isinstance(name, str) else "<unnamed exception>"


def error_message(exc: BaseException) -> str:
    """``str(exc)``, or ``"<unprintable ValueError>"`` when that raises or returns no string."""
    try:
        text = str(exc)
    except Exception:
        return f"<unprintable {error_type(exc)}>"
    if type(text) is not str:  # a str subclass's own methods may be broken too: keep a plain str
        try:
            return str.__str__(text) if isinstance(text, str) else f"<unprintable {error_type(exc)}>"
        except Exception:
            return f"<unprintable {error_type(exc)}>"
    return text


def describe_error(exc: BaseException) -> str:
    """``"ValueError: the message"``, safe for any exception (the report's and the log lines' form)."""
    return f"{error_type(exc)}: {error_message(exc)}"


def error_traceback(exc: BaseException) -> str | None:
    """The formatted traceback of ``exc`` (None without one); never raises."""
    if exc.__traceback__ is None:
        return None
    try:
        return "".join(tb_module.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        # the chain or the notes broke formatting: the frames and a safe last line still say where
        try:
            frames = "".join(tb_module.format_tb(exc.__traceback__))
        except Exception:
            frames = ""
        return f"Traceback (most recent call last):\n{frames}{describe_error(exc)}\n"
