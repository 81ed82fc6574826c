"""The response store's key (docs/guide/response-store.md): what it digests, and pinned values.

A pinned value changing means every stored answer would be paid for again: change ``KEY_VERSION``
and write a migration of the store instead of updating the pin.
"""

from __future__ import annotations

from airflow_provider_datagen.llm.request import KEY_VERSION, TRANSPORT_SETTINGS, LLMRequest


def _request(**overrides: object) -> LLMRequest:
    fields: dict[str, object] = {
        "provider": "openai",
        "base_url": "http://127.0.0.1:8000/v1",
        "model": "gpt-4o-mini",
        "messages": ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Translate: hi"}),
        "schema": None,
        "settings": {"temperature": 0},
    }
    fields.update(overrides)
    return LLMRequest(**fields)  # type: ignore[arg-type]


#: the keys of KEY_VERSION 1: never edit these, migrate the store
PINNED = {
    "text": "6c528fc345982c755918ddcb22c186160cd5f99fc378e758b6eaade9060c4b5c",
    "structured": "8362e8755adfa160ffdc6ca3937c12a6140e0feae4fbdd9cbd1aacdea4be804b",
    "sample": "42f92082ceed2f6198f667cc80911120f9c56660ecabe336c30ea978c0bd7382",
    "anthropic": "2103b2b8b7ab9e6cca2892ef7f626643dcd0f446300611f921a30d5ca465fc72",
}


def _pinned_requests() -> dict[str, LLMRequest]:
    schema = {"type": "object", "properties": {"fr": {"type": "string"}}, "required": ["fr"]}
    return {
        "text": _request(),
        "structured": _request(schema=schema, settings={"temperature": 0.2, "seed": 7}),
        "sample": _request(sample="3"),
        "anthropic": _request(provider="anthropic", base_url=None, model="claude-sonnet-4-5", settings={}),
    }


def test_the_pinned_keys_do_not_change() -> None:
    assert KEY_VERSION == 1
    assert {name: r.key() for name, r in _pinned_requests().items()} == PINNED


def test_the_key_is_of_what_is_asked_and_of_whom() -> None:
    base = _request().key()
    assert _request(base_url="http://127.0.0.1:9000/v1").key() != base
    assert _request(base_url="http://127.0.0.1:8000/v1/").key() == base  # a trailing slash asks the same server
    assert _request(model="gpt-4o").key() != base
    assert _request(provider="anthropic").key() != base
    assert _request(settings={"temperature": 1}).key() != base
    assert _request(sample="1").key() != _request(sample="2").key() != base
    assert _request().followed_by({"role": "assistant", "content": "x"}).key() != base
    assert _request(schema={"type": "object"}).key() != base


def test_transport_settings_are_not_in_the_key() -> None:
    assert {"timeout", "max_retries", "request_timeout"} == TRANSPORT_SETTINGS
    base = _request().key()
    transport = {"temperature": 0, "timeout": 3.0, "max_retries": 5, "request_timeout": 9}
    assert _request(settings=transport).key() == base


def test_the_key_does_not_depend_on_settings_order_or_the_mapping_type() -> None:
    a = _request(settings={"temperature": 0, "seed": 1}).key()
    b = _request(settings={"seed": 1, "temperature": 0}).key()
    assert a == b
    assert _request().digest() == _request().key()
