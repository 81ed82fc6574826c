"""Server-rendered HTML for the datagen UI, from the Jinja2 templates in ``templates/``.

Plain HTML and a little inline CSS, no JavaScript: the machine running Airflow may be offline and the
pages live in an iframe of the Airflow UI, so nothing is fetched from elsewhere. Every value that
comes from a log (item ids, field values, error messages, step names, writer ids) is user data:
autoescaping is on for every template, and :func:`_escape` escapes each ``{{ ... }}`` output
(quotes included, for attributes). URLs built from user data are percent-quoted by :class:`Urls`
and then escaped again for the attribute.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, urlencode

import jinja2
import jinja2.ext
from markupsafe import Markup

from airflow_provider_datagen.core.status import FAILED, display_status
from airflow_provider_datagen.core.store.paths import CHECKPOINTS_DIR
from airflow_provider_datagen.plugins.data import running_not_failed

if TYPE_CHECKING:
    from collections.abc import Sequence


def _q(segment: str) -> str:
    return quote(str(segment), safe="")


class Urls:
    """Links inside the plugin app, all under the mount prefix the request came in on."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.rstrip("/")

    def index(self) -> str:
        return f"{self.prefix}/"

    def experiment(self, pipeline: str, experiment: str, **query: Any) -> str:
        url = f"{self.prefix}/experiments/{_q(pipeline)}/{_q(experiment)}"
        query = {k: v for k, v in query.items() if v not in (None, "")}
        return f"{url}?{urlencode(query)}" if query else url

    def item(self, pipeline: str, experiment: str, item_id: str) -> str:
        # The id travels in the query string: ids may contain "/", "%" or be "..", which path
        # segments would split, decode or normalize away.
        return f"{self.prefix}/experiments/{_q(pipeline)}/{_q(experiment)}/item?{urlencode({'id': item_id})}"

    def blob(self, pipeline: str, experiment: str, event_id: str) -> str:
        return f"{self.prefix}/api/experiments/{_q(pipeline)}/{_q(experiment)}/blob/{_q(event_id)}"

    def ti(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
        return f"{self.prefix}/ti/{_q(dag_id)}/{_q(run_id)}/{_q(task_id)}/{int(map_index)}"

    def api(self, page_url: str) -> str:
        """The JSON twin of a page URL."""
        return self.prefix + "/api" + page_url[len(self.prefix) :]


# --- the template environment ---------------------------------------------------------------------

_LINE_BREAK = re.compile(r"\n[ \t]*")


class _Compact(jinja2.ext.Extension):
    """Drop every line break of an HTML template source and the indentation after it.

    Templates are written one element per line for reading; the pages stay compact markup where no
    whitespace shows up between tags (and where tests look for exact markup). Text that needs a space
    across two lines keeps it on one line. The stylesheet is left as written.
    """

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        if name is not None and name.endswith(".css"):
            return source
        return _LINE_BREAK.sub("", source)


def _escape(value: Any) -> Any:
    """Escape one ``{{ ... }}`` output: ``None`` is empty, markup (macros, blocks) passes through.

    The standard library's escaping (``&#x27;``, ``&quot;``) rather than markupsafe's, so a page's
    escaped text reads the same as ``html.escape`` of the value, quotes included.
    """
    if value is None:
        return ""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def _num(n: Any) -> Any:
    return f"{n:,}" if isinstance(n, int) else n


def _size(n: int | None) -> str:
    if not n:
        return "0 B"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


#: Significant digits of a dollar amount: a call costing $0.000123 reads as that, not $0.0001.
USD_DIGITS = 6


def usd(amount: float) -> str:
    """A dollar amount to :data:`USD_DIGITS` significant digits, never fewer than two decimals.

    Per-call costs are fractions of a cent and totals sum thousands of them: rounding either to a
    fixed number of decimals shows $0.0001 for $0.000123, or $1.12 for $1.125. Trailing zeros past
    the cents are dropped ("$0.25", "$1.125", "$0.000123", "$1,234.57").
    """
    value = float(amount)
    if not math.isfinite(value):
        return f"${value}"
    if value == 0:
        return "$0.00"
    decimals = max(2, USD_DIGITS - 1 - math.floor(math.log10(abs(value))))
    text = f"{abs(value):,.{decimals}f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"{'-' if value < 0 else ''}${whole}.{frac}"


def _percent(fraction: float) -> str:
    return f"{100.0 * fraction:.1f}%"


def _try_header(try_number: int | None) -> str:
    return f"Try {try_number}" if try_number is not None else "Try ?"


def _is_blob_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"blob"} and isinstance(value["blob"], dict)


def _is_blob_list(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(v, dict) and set(v) == {"blob"} for v in value)


class BarPart(NamedTuple):
    status: str
    width: str  # percent of the bar, formatted


class Bar(NamedTuple):
    parts: list[BarPart]
    label: str


def bar_parts(summary: dict[str, Any]) -> Bar:
    """The stacked progress bar over root items: completed, filtered, failed, running, never started."""
    total = summary.get("total") or 0
    if not total:
        return Bar([], "no items")
    counts = {
        "completed": summary.get("completed", 0),
        "filtered": summary.get("filtered", 0),
        FAILED: summary.get("failed_items", 0),
        "running": running_not_failed(summary),
        "never_started": summary.get("never_started", 0),
    }
    parts = [BarPart(k, f"{100.0 * v / total:.3f}") for k, v in counts.items() if v]
    label = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in counts.items())
    return Bar(parts, label)


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("airflow_provider_datagen.plugins", "templates"),
    autoescape=True,
    finalize=_escape,
    undefined=jinja2.StrictUndefined,
    extensions=[_Compact],
)
_ENV.filters.update(
    num=_num,
    size=_size,
    percent=_percent,
    usd=usd,
    try_header=_try_header,
    compact_json=lambda v: json.dumps(v, default=str),
    pretty_json=lambda v: json.dumps(v, ensure_ascii=False, indent=2, sort_keys=True, default=str),
)
_ENV.tests.update(blob_ref=_is_blob_ref, blob_list=_is_blob_list)
_ENV.globals.update(bar_parts=bar_parts, display_status=display_status)


def _render(template: str, urls: Urls | None, **data: Any) -> str:
    return _ENV.get_template(template).render(urls=urls, **data)


# --- the pages ------------------------------------------------------------------------------------


def error_page(status_code: int, message: str, urls: Urls | None = None) -> str:
    return _render("error.html", urls, status_code=status_code, message=message)


def index_page(data: dict[str, Any], urls: Urls) -> str:
    return _render(
        "index.html",
        urls,
        root=data["root"],
        conn_id=data["conn_id"],
        experiments=data["experiments"],
        checkpoints_dir=CHECKPOINTS_DIR,
    )


class Pager(NamedTuple):
    shown: str
    previous: str | None
    next: str | None


def _pager(items: dict[str, Any], urls: Urls) -> Pager:
    p, e = items["pipeline"], items["experiment"]
    total, offset, limit = items["total"], items["offset"], items["limit"]
    # The query's order is the links' order: status, q, scope, version, limit, then offset.
    query = {
        "status": items["status"],
        "q": items["q"],
        "scope": items["scope"],
        "version": items["version"],
        "limit": limit,
    }
    previous = urls.experiment(p, e, **query, offset=max(0, offset - limit)) if offset > 0 else None
    following = urls.experiment(p, e, **query, offset=offset + limit) if offset + limit < total else None
    shown = f"{offset + 1:,}–{min(total, offset + limit):,} of {total:,}" if total else "no matching items"
    return Pager(shown, previous, following)


def experiment_page(status: dict[str, Any], items: dict[str, Any], urls: Urls, statuses: Sequence[str]) -> str:
    return _render(
        "experiment.html",
        urls,
        p=status["pipeline"],
        e=status["experiment"],
        status=status,
        items=items,
        statuses=statuses,
        pager=_pager(items, urls),
    )


def item_page(data: dict[str, Any], urls: Urls) -> str:
    return _render("item.html", urls, data=data)


def ti_page(data: dict[str, Any], urls: Urls) -> str:
    return _render("ti.html", urls, data=data)
