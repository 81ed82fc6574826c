"""An error's text, whatever its __str__ does: an SDK error that breaks formatting fails only its item."""

from __future__ import annotations

import pytest

from airflow_provider_datagen.core.error_text import describe_error, error_message, error_traceback, error_type


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot format")


class NotAString(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


class FancyStr(str):
    def __str__(self) -> str:
        raise RuntimeError("a str subclass that breaks its own methods")


class FancyMessage(Exception):
    def __str__(self) -> str:
        return FancyStr("fancy text")


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (ValueError("plain"), "plain"),
        (BrokenStr(), "<unprintable BrokenStr>"),
        (NotAString(), "<unprintable NotAString>"),
        (FancyMessage(), "fancy text"),
    ],
)
def test_the_message_is_a_plain_string_whatever_str_does(exc: BaseException, message: str) -> None:
    got = error_message(exc)
    assert got == message and type(got) is str
    assert describe_error(exc) == f"{type(exc).__name__}: {message}"


def test_the_type_is_the_class_name() -> None:
    assert error_type(KeyError("k")) == "KeyError"


def test_a_traceback_is_kept_when_the_message_cannot_be_formatted() -> None:
    assert error_traceback(ValueError("never raised")) is None
    try:
        raise BrokenStr
    except BrokenStr as exc:
        text = error_traceback(exc)
    assert text is not None
    assert "test_a_traceback_is_kept_when" in text  # the frame
    assert text.rstrip().splitlines()[-1].startswith(f"{__name__}.BrokenStr")  # the last line names the class
