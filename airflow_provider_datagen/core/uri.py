"""The one test of what a path or URI is: a scheme (``s3://``, ``redis://``), a local path, or ``file://``.

Sources, logs, exports and storage URIs are all given as strings; every module asks here rather than
testing ``"://"`` itself, so the rule (a scheme is what precedes ``://``, matched case-insensitively;
``file://`` is local) has one home.
"""

from __future__ import annotations

from typing import Any

_SEP = "://"
_FILE = "file://"


def has_scheme(uri: str) -> bool:
    """Whether ``uri`` names a scheme (``s3://bucket/x``, ``file:///tmp/x``), not a plain path."""
    return _SEP in uri


def scheme_of(uri: Any) -> str | None:
    """The lower-cased scheme of ``uri`` (``"s3"``, ``"redis"``), None for a plain path or a non-string."""
    if not isinstance(uri, str) or _SEP not in uri:
        return None
    return uri.partition(_SEP)[0].lower()


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a local path (plain or ``file://``) rather than an object-store URI."""
    return _SEP not in uri or uri.startswith(_FILE)


def local_path(uri: str) -> str:
    """The filesystem path of a local ``uri``."""
    return uri[len(_FILE) :] if uri.startswith(_FILE) else uri
