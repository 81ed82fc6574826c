"""DatagenHook: connection -> root and storage options; errors name the connection and the fix."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.hooks.datagen import DatagenHook, default_root, redact_uri

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str = "datagen_default", **fields: object) -> None:
    """Define a connection the way a deployment would: a JSON ``AIRFLOW_CONN_<ID>`` variable."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "datagen", **fields}))


def test_missing_connection_uses_embedded_default_root(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_DATAGEN_DEFAULT", raising=False)
    hook = DatagenHook()

    assert hook.connection is None
    assert hook.root == os.path.join(os.environ["AIRFLOW_HOME"], "datagen")
    assert hook.root == default_root()
    assert hook.storage_options == {}


def test_host_is_the_root_and_storage_options_come_from_extra(monkeypatch):
    set_conn(
        monkeypatch,
        host="s3://bucket/prefix/",
        extra={
            "storage_options": {
                "aws_access_key_id": KEY_ID,
                "aws_secret_access_key": SECRET,
                "aws_endpoint": "http://127.0.0.1:9000",
                "allow_http": True,
                "timeout": 30,
            }
        },
    )
    hook = DatagenHook()

    assert hook.root == "s3://bucket/prefix"
    assert hook.storage_options == {
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_endpoint": "http://127.0.0.1:9000",
        "allow_http": "true",
        "timeout": "30",
    }


def test_custom_conn_id_and_extra_root(monkeypatch, tmp_path):
    set_conn(monkeypatch, "my_datagen", extra={"root": str(tmp_path)})
    hook = DatagenHook(datagen_conn_id="my_datagen")

    assert hook.root == str(tmp_path)
    assert hook.storage_options == {}


def test_uri_form_connection_with_root_in_query(monkeypatch):
    # The URI form cannot carry "s3://..." as a host, hence extra "root" (query parameters are extra).
    monkeypatch.setenv("AIRFLOW_CONN_DATAGEN_DEFAULT", "datagen://?root=s3%3A%2F%2Fbucket%2Fp&storage_options=%7B%7D")
    hook = DatagenHook()

    assert hook.root == "s3://bucket/p"
    assert hook.storage_options == {}


def test_storage_options_given_as_json_text(monkeypatch):
    set_conn(monkeypatch, host="s3://b", extra={"storage_options": json.dumps({"aws_region": "eu-west-1"})})

    assert DatagenHook().storage_options == {"aws_region": "eu-west-1"}


def test_prefixed_extra_keys_and_empty_fields_are_accepted(monkeypatch, tmp_path):
    set_conn(
        monkeypatch,
        host=str(tmp_path),
        extra={"extra__datagen__storage_options": {"aws_region": "x"}, "root": None},
    )
    hook = DatagenHook()

    assert hook.root == str(tmp_path)
    assert hook.storage_options == {"aws_region": "x"}


def test_connection_without_root_uses_default(monkeypatch):
    set_conn(monkeypatch)

    assert DatagenHook().root == default_root()


@pytest.mark.parametrize(
    ("fields", "attribute", "problem"),
    [
        ({"host": "s3://b", "extra": "{not json"}, "root", "extra is not valid JSON"),
        ({"host": "s3://b", "extra": "[1, 2]"}, "root", "extra is a JSON list"),
        ({"host": "s3://b", "extra": {"storage_option": {}}}, "root", "unknown key 'storage_option'"),
        ({"host": "s3://a", "extra": {"root": "s3://b"}}, "root", "different values"),
        ({"host": "data/relative"}, "root", "relative path"),
        ({"extra": {"root": 5}}, "root", "'root' is a int"),
        ({"host": "s3://b", "extra": {"storage_options": "{oops"}}, "storage_options", "not valid JSON"),
        ({"host": "s3://b", "extra": {"storage_options": ["a"]}}, "storage_options", "a list, not an object"),
        (
            {"host": "s3://b", "extra": {"storage_options": {"nested": {"a": 1}}}},
            "storage_options",
            "storage option 'nested' is a dict",
        ),
    ],
)
def test_garbled_connection_raises_configuration_error(monkeypatch, fields, attribute, problem):
    set_conn(monkeypatch, "broken_conn", **fields)
    hook = DatagenHook("broken_conn")

    with pytest.raises(ConfigurationError) as excinfo:
        getattr(hook, attribute)

    message = str(excinfo.value)
    assert "'broken_conn'" in message
    assert problem in message
    # Every message ends with what to do about it.
    assert any(word in message for word in ("set ", "use ", "keep ", "give "))


def test_garbled_extra_message_does_not_echo_the_text(monkeypatch):
    set_conn(monkeypatch, host="s3://b", extra='{"storage_options": {"aws_secret_access_key": "' + SECRET)

    with pytest.raises(ConfigurationError) as excinfo:
        DatagenHook().storage_options  # noqa: B018

    assert SECRET not in str(excinfo.value)


def test_repr_hides_storage_option_values(monkeypatch):
    set_conn(
        monkeypatch,
        host="s3://bucket/prefix",
        extra={"storage_options": {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}},
    )
    hook = DatagenHook()
    assert repr(hook) == "DatagenHook(datagen_conn_id='datagen_default')"  # nothing resolved yet

    hook.root  # noqa: B018
    hook.storage_options  # noqa: B018
    text = repr(hook)

    assert SECRET not in text
    assert KEY_ID not in text
    assert "'aws_secret_access_key': '***'" in text
    assert "root='s3://bucket/prefix'" in text
    assert str(hook) == text


def test_storage_option_secrets_are_registered_with_the_masker(monkeypatch):
    from airflow.sdk.log import redact

    azure_key = "bm90LWEtcmVhbC1henVyZS1rZXk="
    set_conn(
        monkeypatch,
        host="az://container/prefix",
        extra={"storage_options": {"aws_secret_access_key": SECRET, "azure_storage_account_key": azure_key}},
    )
    DatagenHook().storage_options  # noqa: B018

    assert redact(f"creds {SECRET} and {azure_key}") == "creds *** and ***"


def test_redact_uri_drops_user_info():
    assert redact_uri("s3://user:pw@host/bucket") == "s3://***@host/bucket"
    assert redact_uri("s3://bucket/prefix") == "s3://bucket/prefix"
    assert redact_uri("/local/path") == "/local/path"


def test_get_log_opens_checkpoint_log_with_root_and_options(monkeypatch):
    calls = []

    class FakeCheckpointLog:
        @classmethod
        def open(cls, root, *, pipeline, experiment, storage_options=None):
            calls.append((root, pipeline, experiment, storage_options))
            return cls()

    # The hook imports core lazily; a stand-in module keeps this test independent of Lance.
    fake_core = types.ModuleType("airflow_provider_datagen.core")
    fake_core.CheckpointLog = FakeCheckpointLog  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow_provider_datagen.core", fake_core)

    set_conn(monkeypatch, host="s3://bucket/p", extra={"storage_options": {"aws_region": "us-east-1"}})
    assert isinstance(DatagenHook().get_log("pipe", "exp1"), FakeCheckpointLog)
    monkeypatch.delenv("AIRFLOW_CONN_DATAGEN_DEFAULT")
    DatagenHook().get_log("pipe", "exp2")

    assert calls == [
        ("s3://bucket/p", "pipe", "exp1", {"aws_region": "us-east-1"}),
        (default_root(), "pipe", "exp2", None),
    ]


def test_hook_class_attributes():
    assert DatagenHook.conn_name_attr == "datagen_conn_id"
    assert DatagenHook.default_conn_name == "datagen_default"
    assert DatagenHook.conn_type == "datagen"
    assert DatagenHook.hook_name == "Datagen"
    assert DatagenHook("x").datagen_conn_id == "x"


def test_rate_limit_storage_comes_from_extra(monkeypatch):
    set_conn(monkeypatch, host="s3://b", extra={"rate_limit_storage": " redis://redis-host:6379/0 "})
    assert DatagenHook().rate_limit_storage == "redis://redis-host:6379/0"
    set_conn(monkeypatch, "prefixed", host="s3://b", extra={"extra__datagen__rate_limit_storage": "rediss://h:1/2"})
    assert DatagenHook("prefixed").rate_limit_storage == "rediss://h:1/2"


def test_no_rate_limit_storage_means_the_embedded_one(monkeypatch):
    set_conn(monkeypatch, host="s3://b", extra={"rate_limit_storage": ""})
    assert DatagenHook().rate_limit_storage is None
    assert DatagenHook("no_such_conn").rate_limit_storage is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (6379, "its extra 'rate_limit_storage' is a int, not a string"),
        ("redis-host:6379", "'redis-host:6379' is not a shared rate limit storage URI"),
        ("memory://", "'memory://' is not a shared rate limit storage URI"),
        ("memcached://u:pw@h:1", "'memcached://***@h:1' is not a shared rate limit storage URI"),
    ],
)
def test_bad_rate_limit_storage_is_a_configuration_error(monkeypatch, value, problem):
    set_conn(monkeypatch, "broken_conn", host="s3://b", extra={"rate_limit_storage": value})
    with pytest.raises(ConfigurationError) as excinfo:
        DatagenHook("broken_conn").rate_limit_storage  # noqa: B018
    message = str(excinfo.value)
    assert message.startswith("Connection 'broken_conn' is misconfigured: ")
    assert problem in message
    assert 'set "rate_limit_storage" to a Redis URI' in message
    assert "pw" not in message


def test_rate_limit_storage_password_is_masked_and_not_in_repr(monkeypatch):
    from airflow.sdk.log import redact

    set_conn(monkeypatch, host="s3://b", extra={"rate_limit_storage": f"redis://:{SECRET}@redis-host:6379/0"})
    hook = DatagenHook()
    assert hook.rate_limit_storage == f"redis://:{SECRET}@redis-host:6379/0"
    assert redact(f"uri {SECRET}") == "uri ***"
    assert SECRET not in repr(hook)
    assert "rate_limit_storage='redis://***@redis-host:6379/0'" in repr(hook)


def test_get_response_store_opens_the_store_under_the_root(monkeypatch, tmp_path):
    from airflow_provider_datagen.core import ResponseStore
    from airflow_provider_datagen.core.store.responses import ResponseEntry

    set_conn(monkeypatch, host=str(tmp_path))
    store = DatagenHook().get_response_store()
    assert isinstance(store, ResponseStore)
    assert store.uri == f"{tmp_path}/datagen_responses"
    store.put_many([ResponseEntry("ab" * 32, "{}", "openai:gpt-4o-mini")])
    assert DatagenHook().get_response_store().stats()["entries"] == 1
