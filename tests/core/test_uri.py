"""core/uri.py: the one rule for schemes, local paths and file:// URIs."""

from __future__ import annotations

import pytest

from airflow_provider_datagen.core.store.paths import is_local as store_is_local
from airflow_provider_datagen.core.uri import has_scheme, is_local, local_path, scheme_of


@pytest.mark.parametrize(
    ("uri", "scheme", "local"),
    [
        ("/data/prompts.jsonl", None, True),
        ("relative/prompts.parquet", None, True),
        ("file:///data/prompts.jsonl", "file", True),
        ("s3://bucket/prompts.jsonl", "s3", False),
        ("S3://Bucket/x", "s3", False),
        ("redis://127.0.0.1:6379/0", "redis", False),
        ("gs://b/x.lance", "gs", False),
    ],
)
def test_scheme_and_locality(uri: str, scheme: str | None, local: bool) -> None:
    assert scheme_of(uri) == scheme
    assert has_scheme(uri) is (scheme is not None)
    assert is_local(uri) is local
    assert store_is_local(uri) is local  # the store's name for it is the same rule


def test_scheme_of_a_non_string_is_none() -> None:
    assert scheme_of(None) is None and scheme_of(42) is None


def test_local_path_strips_file_scheme_only() -> None:
    assert local_path("file:///tmp/x") == "/tmp/x"
    assert local_path("/tmp/x") == "/tmp/x"
