"""A batch request's identities: its ``custom_id`` (item, input fingerprint, attempt) and a submission's key."""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


def custom_id(item_id: str, fingerprint: str, attempt: int) -> str:
    """A request's ``custom_id``: a digest of the item id and its input fingerprint, then ``-<attempt>``.

    Deterministic (a crash and a rerun ask the same ids); within Anthropic's ``^[a-zA-Z0-9_-]{1,64}$``.
    The part before the last ``-`` is the item's base, the same for each of its attempts.
    """
    digest = hashlib.sha256(f"{item_id}\x00{fingerprint}".encode()).hexdigest()[:40]
    return f"{digest}-{attempt}"


def attempt_of(cid: str) -> int:
    """The attempt a ``custom_id`` of :func:`custom_id` was made for."""
    return int(cid.rsplit("-", 1)[1])


def submission_key(log_uri: str, custom_ids: Sequence[str]) -> str:
    """A new submission's key, unique: the intent row records it before the provider is asked, so a
    re-attach reads it back. Not a digest of the custom_ids alone: a new generation of the same items
    (a new step version after they failed) asks the same custom_ids again, and a key equal to the
    earlier, closed submission's would fold the new one into it (never polled, never recorded)."""
    nonce = uuid.uuid4().hex
    return hashlib.sha256("\n".join([log_uri, nonce, *sorted(custom_ids)]).encode()).hexdigest()[:32]


def base_of(cid: str) -> str:
    """The item's part of a ``custom_id`` of :func:`custom_id`: the same for each of its attempts."""
    return cid.rsplit("-", 1)[0]
