"""DatagenHook: turns an Airflow connection into a root URI, storage options and a CheckpointLog."""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_datagen.core.uri import scheme_of
from airflow_provider_datagen.exceptions import ConfigurationError

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from airflow_provider_datagen.core import CheckpointLog, ResponseStore

# Keys DatagenHook understands in Connection.extra. Older forms prefix custom fields with
# ``extra__<conn_type>__``; both spellings are accepted so a connection made by any UI version works.
_EXTRA_KEYS = ("root", "storage_options", "rate_limit_storage")
_EXTRA_PREFIX = "extra__datagen__"

# Airflow's masker hides values only under names it deems sensitive ("secret", "token", ...). Object
# store keys are named in many ways (azure "account_key", gcs "service_account_key", "sas_token"), so
# values under any of these fragments are masked too.
_SECRET_KEY_FRAGMENTS = ("key", "secret", "token", "password", "credential", "sas", "signature")

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def default_root() -> str:
    """Return the embedded default root, ``$AIRFLOW_HOME/datagen``, used when no connection exists."""
    # Deferred and guarded: the full Airflow configuration is absent on a task-SDK-only worker.
    try:
        from airflow.configuration import get_airflow_home
    except ImportError:  # a worker with only the task SDK installed
        home = os.path.expanduser(os.environ.get("AIRFLOW_HOME", "~/airflow"))
    else:
        home = get_airflow_home()
    return os.path.join(home, "datagen")


def redact_uri(uri: str) -> str:
    """Drop the user-info part (``user:password@``) of a URI, so a root can be logged and shown."""
    if not _URI_RE.match(uri):
        return uri
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    netloc = "***@" + parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _json_problem(err: ValueError) -> str:
    # JSONDecodeError's own str() is safe too, but be explicit: message and position, never the text.
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at line {err.lineno} column {err.colno}"
    return type(err).__name__


class DatagenHook(BaseHook):
    """
    Resolve where the datagen event logs live and open them.

    The connection's *host* (shown as "Root URI" in the UI) or its extra ``root`` is a local absolute
    path or an object-store URI (``s3://bucket/prefix``); the extra ``storage_options`` is a JSON object
    handed to Lance (credentials, endpoint, region). When the connection does not exist, the root is
    ``$AIRFLOW_HOME/datagen`` so the example DAGs run with no set-up. Storage options are registered
    with Airflow's secret masker and never appear in logs or in ``repr()``. The extra
    ``rate_limit_storage`` (e.g. ``redis://redis-host:6379/0``) is where shared rate limits are kept
    when workers run on many hosts; without it they are kept on each host, beside a local root.

    Example connection as an environment variable::

        AIRFLOW_CONN_DATAGEN_DEFAULT='{"conn_type": "datagen", "host": "s3://bucket/prefix",
            "extra": {"storage_options": {"aws_endpoint": "http://127.0.0.1:9000"}}}'

    :param datagen_conn_id: id of a connection of type ``datagen``; a missing connection falls back
        to the embedded default root.
    """

    conn_name_attr = "datagen_conn_id"
    default_conn_name = "datagen_default"
    conn_type = "datagen"
    hook_name = "Datagen"

    def __init__(self, datagen_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.datagen_conn_id = datagen_conn_id

    @cached_property
    def connection(self) -> Connection | None:
        """The Airflow connection, or ``None`` when it does not exist (the embedded default applies)."""
        try:
            return self.get_connection(self.datagen_conn_id)
        except AirflowNotFoundException:
            self.log.info(
                "Connection %r does not exist; using the embedded default root %s",
                self.datagen_conn_id,
                default_root(),
            )
            return None

    @cached_property
    def extra(self) -> dict[str, Any]:
        """The connection's extra as a dict with unprefixed keys; ``{}`` without a connection."""
        conn = self.connection
        raw = conn.extra if conn is not None else None
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return {}
        if isinstance(raw, dict):
            parsed: Any = raw
        else:
            try:
                parsed = json.loads(raw)
            except ValueError as err:
                # The message names the position only: the text itself may hold credentials.
                raise self._config_error(
                    f"its extra is not valid JSON ({_json_problem(err)})",
                    'set extra to a JSON object such as {"root": "s3://bucket/prefix", '
                    '"storage_options": {"aws_region": "us-east-1"}}',
                ) from None
        if not isinstance(parsed, dict):
            raise self._config_error(
                f"its extra is a JSON {type(parsed).__name__}, not an object",
                'set extra to a JSON object such as {"storage_options": {...}}',
            )
        extra: dict[str, Any] = {}
        for key, value in parsed.items():
            name = key[len(_EXTRA_PREFIX) :] if key.startswith(_EXTRA_PREFIX) else key
            if name not in _EXTRA_KEYS:
                raise self._config_error(
                    f"its extra has the unknown key {key!r}",
                    f"use only {', '.join(repr(k) for k in _EXTRA_KEYS)} (a typo here would silently drop credentials)",
                )
            # The UI stores an empty field as null or ""; that means "not set".
            if value is None or value == "":
                continue
            extra[name] = value
        return extra

    @cached_property
    def root(self) -> str:
        """The root URI or absolute path under which ``datagen_checkpoints/`` lives."""
        conn = self.connection
        if conn is None:
            return default_root()
        host = (conn.host or "").strip() or None
        extra_root = self.extra.get("root")
        if extra_root is not None and not isinstance(extra_root, str):
            raise self._config_error(
                f"its extra 'root' is a {type(extra_root).__name__}, not a string",
                'set "root" to a path or URI string such as "s3://bucket/prefix"',
            )
        extra_root = (extra_root or "").strip() or None
        if host and extra_root and host.rstrip("/") != extra_root.rstrip("/"):
            raise self._config_error(
                "it sets both host (Root URI) and extra 'root' to different values",
                "keep only one of them",
            )
        root = host or extra_root
        if root is None:
            root = default_root()
            self.log.info("Connection %r sets no root; using the embedded default root %s", self.datagen_conn_id, root)
            return root
        if _URI_RE.match(root):
            stripped = root.rstrip("/")
            return root if stripped.endswith(":") else stripped
        root = os.path.normpath(os.path.expanduser(root))
        if not os.path.isabs(root):
            # Each Airflow component runs in its own working directory, so a relative root would
            # resolve to a different place in the scheduler, the worker and the api-server.
            raise self._config_error(
                f"its root {root!r} is a relative path",
                "use an absolute path or a URI such as s3://bucket/prefix",
            )
        return root

    @cached_property
    def storage_options(self) -> dict[str, str]:
        """Lance storage options from the extra ``storage_options`` (a JSON object or its JSON text)."""
        raw = self.extra.get("storage_options")
        if raw is None:
            return {}
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as err:
                raise self._config_error(
                    f"its extra 'storage_options' is a string that is not valid JSON ({_json_problem(err)})",
                    'set "storage_options" to a JSON object such as {"aws_region": "us-east-1"}',
                ) from None
        if not isinstance(raw, dict):
            raise self._config_error(
                f"its extra 'storage_options' is a {type(raw).__name__}, not an object",
                'set "storage_options" to a JSON object such as {"aws_region": "us-east-1"}',
            )
        options: dict[str, str] = {}
        for key, value in raw.items():
            # Lance takes str -> str; JSON booleans and numbers are written the way object-store
            # clients parse them ("true", "30").
            if isinstance(value, bool):
                options[key] = "true" if value else "false"
            elif isinstance(value, (str, int, float)):
                options[key] = str(value)
            else:
                raise self._config_error(
                    f"its storage option {key!r} is a {type(value).__name__}",
                    "give every storage option a string, number or boolean value",
                )
        self._mask(options)
        return options

    @cached_property
    def rate_limit_storage(self) -> str | None:
        """The shared rate limit storage URI of the extra ``rate_limit_storage``, e.g.
        ``redis://redis-host:6379/0``; ``None``: the embedded storage (every process of one host)."""
        raw = self.extra.get("rate_limit_storage")
        if raw is None:
            return None
        # Deferred: core imports Lance, which the connection form (every component) must not pay for.
        from airflow_provider_datagen.core.ratelimit import REDIS_SCHEMES

        fix = 'set "rate_limit_storage" to a Redis URI such as "redis://redis-host:6379/0", or leave it empty'
        if not isinstance(raw, str):
            raise self._config_error(f"its extra 'rate_limit_storage' is a {type(raw).__name__}, not a string", fix)
        uri = raw.strip()
        scheme = scheme_of(uri)
        # memory:// would be private to each process: a connection's storage is for sharing.
        if scheme not in REDIS_SCHEMES:
            raise self._config_error(
                f"its extra 'rate_limit_storage' {redact_uri(uri)!r} is not a shared rate limit storage URI "
                f"(schemes: {', '.join(REDIS_SCHEMES)})",
                fix,
            )
        password = urlsplit(uri).password
        if password:
            self._mask({"password": password})
        return uri

    def get_log(self, pipeline: str, experiment: str) -> CheckpointLog:
        """
        Open (or create) the event log of one experiment.

        :param pipeline: pipeline name, validated by the log.
        :param experiment: experiment name, validated by the log.
        """
        # Imported here so that loading the hook (every Airflow component does, for the connection
        # form) never imports Lance.
        from airflow_provider_datagen.core import CheckpointLog

        return CheckpointLog.open(
            self.root,
            pipeline=pipeline,
            experiment=experiment,
            storage_options=self.storage_options or None,
        )

    def get_response_store(self) -> ResponseStore:
        """
        Open the response store every experiment under the root shares: ``<root>/datagen_responses/``.

        :raises ResponseStoreError: what is there is not a response store, is damaged, or cannot be reached.
        """
        from airflow_provider_datagen.core import ResponseStore

        return ResponseStore.open(self.root, self.storage_options or None)

    def __repr__(self) -> str:
        # Resolving the connection inside repr() would hit the secrets backends from a debugger or a
        # log line, so only what is already resolved is shown; option values are never shown.
        parts = [f"datagen_conn_id={self.datagen_conn_id!r}"]
        if "root" in self.__dict__:
            parts.append(f"root={redact_uri(self.__dict__['root'])!r}")
        if self.__dict__.get("rate_limit_storage"):
            parts.append(f"rate_limit_storage={redact_uri(self.__dict__['rate_limit_storage'])!r}")
        if "storage_options" in self.__dict__:
            keys = ", ".join(f"{k!r}: '***'" for k in sorted(self.__dict__["storage_options"]))
            parts.append(f"storage_options={{{keys}}}")
        return f"{type(self).__name__}({', '.join(parts)})"

    __str__ = __repr__

    def _config_error(self, problem: str, fix: str) -> ConfigurationError:
        return ConfigurationError(f"Connection {self.datagen_conn_id!r} is misconfigured: {problem}; {fix}.")

    @staticmethod
    def _mask(options: dict[str, str]) -> None:
        # Deferred: masking matters only once a connection with secrets is read, not on import.
        try:
            from airflow.sdk.log import mask_secret
        except ImportError:  # pragma: no cover - the task SDK always ships it
            return
        for key, value in options.items():
            lowered = key.lower()
            if any(fragment in lowered for fragment in _SECRET_KEY_FRAGMENTS):
                mask_secret(value)
            else:
                # Airflow's own list of sensitive names still applies to the other keys.
                mask_secret(value, key)
