"""Server-rendered HTML for the datagen UI: plain HTML and a little inline CSS, no JavaScript.

The machine running Airflow may be offline and the pages live in an iframe of the Airflow UI, so
nothing is fetched from elsewhere. Every value that comes from a log (item ids, field values, error
messages, step names, writer ids) is user data: it only ever reaches the page through :func:`esc`,
and URLs built from it are percent-quoted and then escaped again for the attribute.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

_STATUS_ORDER = ("completed", "filtered", "failed", "running", "never_started")


def esc(value: Any) -> str:
    """HTML-escape anything (``None`` shows as an empty string), quotes included for attributes."""
    if value is None:
        return ""
    return html.escape(str(value), quote=True)


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


_CSS = """
:root{color-scheme:light dark;--fg:#1a202c;--muted:#5f6b7a;--bg:#fff;--line:#e2e8f0;--soft:#f7f9fb;
--link:#1d5fbf;--ok:#2f9e44;--filt:#868e96;--fail:#d9480f;--run:#1c7ed6;--never:#ced4da}
@media (prefers-color-scheme:dark){:root{--fg:#e6e9ed;--muted:#9aa5b1;--bg:#1b1f24;--line:#343a42;
--soft:#22272e;--link:#74a7f2}}
body{margin:0;padding:16px 20px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
a{color:var(--link);text-decoration:none}a:hover{text-decoration:underline}
h1{font-size:20px;margin:0 0 4px}h1.mono{font-size:17px;word-break:break-all}h2{font-size:16px;margin:22px 0 8px}
.crumbs{color:var(--muted);margin-bottom:10px}.muted{color:var(--muted)}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}
pre{background:var(--soft);border:1px solid var(--line);border-radius:4px;padding:8px;overflow:auto;
max-height:420px;white-space:pre-wrap;word-break:break-word;margin:4px 0}
.bar{display:flex;height:10px;min-width:160px;border-radius:5px;overflow:hidden;background:var(--never)}
.bar span{display:block;height:100%}
.s-completed{background:var(--ok)}.s-filtered{background:var(--filt)}.s-failed{background:var(--fail)}
.s-running{background:var(--run)}.s-never_started{background:var(--never)}
.badge{display:inline-block;padding:0 7px;border-radius:9px;color:#fff;font-size:12px;white-space:nowrap}
.badge.s-never_started{color:#333}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:6px 12px;min-width:90px}
.card b{display:block;font-size:18px}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin:8px 0}
input,select,button{font:inherit;padding:2px 6px}
.pager{display:flex;gap:12px;align-items:center;margin:6px 0}
.err{border:1px solid var(--fail);border-radius:6px;padding:10px 14px}
tr.rejected td{opacity:.55}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}dl.kv dt{color:var(--muted)}
dl.kv dd{margin:0}
"""


def page(title: str, body: str, *, crumbs: Sequence[tuple[str, str | None]] = ()) -> str:
    """A complete HTML document; ``title`` and crumb labels are escaped here, ``body`` is trusted markup."""
    trail = " / ".join(f'<a href="{esc(href)}">{esc(label)}</a>' if href else esc(label) for label, href in crumbs)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta name='referrer' content='same-origin'>"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        + (f"<div class='crumbs'>{trail}</div>" if trail else "")
        + body
        + "</body></html>"
    )


def error_page(status_code: int, message: str, urls: Urls | None = None) -> str:
    back = f"<p><a href='{esc(urls.index())}'>All experiments</a></p>" if urls else ""
    title = "Not found" if status_code == 404 else f"Error {status_code}"
    return page(title, f"<h1>{esc(title)}</h1><div class='err'>{esc(message)}</div>{back}")


def _badge(status: str | None) -> str:
    if not status:
        return ""
    return f"<span class='badge s-{esc(status)}'>{esc(status.replace('_', ' '))}</span>"


def _num(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else esc(n)


def _size(n: int | None) -> str:
    if not n:
        return "0 B"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _short(text: str | None, n: int = 12) -> str:
    if not text:
        return ""
    return f"<span class='mono' title='{esc(text)}'>{esc(text[:n])}{'…' if len(text) > n else ''}</span>"


def progress_bar(summary: dict[str, Any]) -> str:
    """A stacked bar over root items: completed, filtered, failed (running with failures), running."""
    total = summary.get("total") or 0
    if not total:
        return "<div class='bar' title='no items'></div>"
    failed = summary.get("failed_items", 0)
    parts = {
        "completed": summary.get("completed", 0),
        "filtered": summary.get("filtered", 0),
        "failed": failed,
        "running": max(0, summary.get("running", 0) - failed),
        "never_started": summary.get("never_started", 0),
    }
    spans = "".join(
        f"<span class='s-{k}' style='width:{100.0 * v / total:.3f}%'></span>" for k, v in parts.items() if v
    )
    label = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in parts.items())
    return f"<div class='bar' title='{esc(label)}'>{spans}</div>"


def _table(headers: Iterable[str], rows: Iterable[str], *, num: Iterable[int] = ()) -> str:
    nums = set(num)
    head = "".join(
        f"<th class='num'>{esc(h)}</th>" if i in nums else f"<th>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# --- index ----------------------------------------------------------------------------------------


def index_page(data: dict[str, Any], urls: Urls) -> str:
    rows = []
    for exp in data["experiments"]:
        link = urls.experiment(exp["pipeline"], exp["experiment"])
        name = f"<a href='{esc(link)}'>{esc(exp['experiment'])}</a>"
        if exp.get("error"):
            rows.append(
                f"<tr><td>{esc(exp['pipeline'])}</td><td>{name}</td>"
                f"<td colspan='8' class='err'>{esc(exp['error'])}</td></tr>"
            )
            continue
        s = exp["summary"]
        rows.append(
            f"<tr><td>{esc(exp['pipeline'])}</td><td>{name}</td>"
            f"<td>{progress_bar(s)}</td><td class='num'>{100.0 * exp['progress']:.1f}%</td>"
            f"<td class='num'>{_num(s['total'])}</td><td class='num'>{_num(s['completed'])}</td>"
            f"<td class='num'>{_num(s['filtered'])}</td><td class='num'>{_num(s['running'])}</td>"
            f"<td class='num'>{_num(s['failed_items'])}</td><td class='num'>{_num(s['log_version'])}</td></tr>"
        )
    if rows:
        table = _table(
            [
                "Pipeline",
                "Experiment",
                "Progress",
                "Done",
                "Items",
                "Completed",
                "Filtered",
                "Running",
                "Failed",
                "Log version",
            ],
            rows,
            num=(3, 4, 5, 6, 7, 8, 9),
        )
    else:
        table = (
            "<p class='muted'>No experiments yet: nothing under "
            f"<code>{esc(data['root'])}/datagen_checkpoints/</code>. Run a datagen DAG, or point the "
            f"<code>{esc(data['conn_id'])}</code> connection at the root your DAGs write to.</p>"
        )
    body = (
        "<h1>Datagen experiments</h1>"
        f"<p class='muted'>Root <code>{esc(data['root'])}</code> (connection <code>{esc(data['conn_id'])}</code>)"
        f" · <a href='{esc(urls.api(urls.index()) + 'experiments')}'>JSON</a></p>{table}"
    )
    return page("Datagen experiments", body)


# --- experiment -----------------------------------------------------------------------------------


def experiment_page(status: dict[str, Any], items: dict[str, Any], urls: Urls, statuses: Sequence[str]) -> str:
    p, e = status["pipeline"], status["experiment"]
    s = status
    cards = "".join(
        f"<div class='card'><span class='muted'>{esc(label)}</span><b>{_num(s[key])}</b></div>"
        for label, key in (
            ("items", "total"),
            ("completed", "completed"),
            ("filtered", "filtered"),
            ("running", "running"),
            ("failed items", "failed_items"),
            ("never started", "never_started"),
            ("pending", "pending"),
            ("fan-out children", "children"),
            ("fencing violations", "fencing_violations"),
        )
    )
    stats = s["stats"]
    log_line = (
        f"Log version <b>{_num(s['log_version'])}</b> · {_num(stats.get('events'))} events · "
        f"{_num(stats.get('fragments'))} fragments · {esc(_size(stats.get('size_bytes')))}"
    )
    failures = s["recent_failures"]
    if failures:
        frows = [
            "<tr>"
            f"<td><a href='{esc(urls.item(p, e, f['item_id']))}' class='mono'>{esc(f['item_id'])}</a></td>"
            f"<td>{esc(f['step'])}</td><td><b>{esc(f['error_type'])}</b>: {esc(f['message'][:300])}</td>"
            f"<td>{esc(f['task_id'])}</td><td class='num'>{esc(f['map_index'])}</td>"
            f"<td class='num'>{esc(f['try_number'])}</td><td class='mono'>{esc(f['created_at'])}</td></tr>"
            for f in failures
        ]
        fail_html = (
            f"<h2>Failures <span class='muted'>({_num(s['failure_rows'])} rows; newest first)</span></h2>"
            + _table(["Item", "Step", "Error", "Task", "Map index", "Try", "At"], frows, num=(4, 5))
        )
    else:
        fail_html = "<h2>Failures</h2><p class='muted'>No failures recorded.</p>"

    # Filters are a plain GET form, so a filtered page is a URL that can be shared and reloaded.
    opts = "".join(
        f"<option value='{esc(v)}'{' selected' if items['status'] == v else ''}>{esc(v.replace('_', ' '))}</option>"
        for v in statuses
    )
    scopes = "".join(
        f"<option value='{v}'{' selected' if items['scope'] == v else ''}>{label}</option>"
        for v, label in (("roots", "source items"), ("children", "fan-out children"), ("all", "all items"))
    )
    form = (
        f"<form class='filters' method='get' action='{esc(urls.experiment(p, e))}'>"
        f"<label>Status <select name='status'><option value=''>any</option>{opts}</select></label>"
        f"<label>Items <select name='scope'>{scopes}</select></label>"
        f"<label>Id contains <input name='q' value='{esc(items['q'] or '')}' size='24'></label>"
        f"<input type='hidden' name='limit' value='{items['limit']}'>"
        "<button type='submit'>Filter</button></form>"
    )
    irows = [
        "<tr>"
        f"<td><a href='{esc(urls.item(p, e, r['item_id']))}' class='mono'>{esc(r['item_id'])}</a></td>"
        f"<td>{_badge('failed' if r['status'] == 'running' and r['failures'] else r['status'])}</td>"
        f"<td class='num'>{_num(r['failures'])}</td><td class='num'>{_num(r['violations'])}</td>"
        f"<td class='num'>{_num(r['last_seq'])}</td><td class='num'>{_num(r['max_epoch'])}</td>"
        f"<td>{_short(r['input_fingerprint'])}</td><td>{esc(r['processor_version'])}</td></tr>"
        for r in items["items"]
    ]
    total, offset, limit = items["total"], items["offset"], items["limit"]
    query = {"status": items["status"], "q": items["q"], "scope": items["scope"], "limit": limit}
    nav = []
    if offset > 0:
        nav.append(f"<a href='{esc(urls.experiment(p, e, **query, offset=max(0, offset - limit)))}'>← previous</a>")
    if offset + limit < total:
        nav.append(f"<a href='{esc(urls.experiment(p, e, **query, offset=offset + limit))}'>next →</a>")
    shown = f"{offset + 1:,}–{min(total, offset + limit):,} of {total:,}" if total else "no matching items"
    pager = f"<div class='pager'><span class='muted'>{shown}</span>{''.join(nav)}</div>"
    table = (
        _table(
            ["Item", "Status", "Failures", "Violations", "Last seq", "Epoch", "Input", "Processor"],
            irows,
            num=(2, 3, 4, 5),
        )
        if irows
        else ""
    )
    api = urls.api(urls.experiment(p, e))
    body = (
        f"<h1>{esc(p)} / {esc(e)}</h1>"
        f"<div>{progress_bar(s)}</div><p class='muted'>{100.0 * s['progress']:.1f}% of source items done</p>"
        f"<div class='cards'>{cards}</div><p class='muted'>{log_line} · "
        f"<a href='{esc(api)}'>status JSON</a> · <a href='{esc(api + '/items')}'>items JSON</a></p>"
        f"{fail_html}<h2>Items</h2>{form}{pager}{table}{pager if irows else ''}"
    )
    return page(f"{p}/{e} · Datagen", body, crumbs=[("Experiments", urls.index()), (f"{p} / {e}", None)])


# --- item -----------------------------------------------------------------------------------------


def _value_html(value: Any, urls: Urls, p: str, e: str) -> str:
    if isinstance(value, dict) and set(value) == {"blob"} and isinstance(value["blob"], dict):
        b = value["blob"]
        # A plain link: the browser fetches the bytes only when it is clicked.
        return (
            f"<a href='{esc(urls.blob(p, e, b['event_id']))}' download>download {esc(b['kind'])} blob</a> "
            f"<span class='muted'>({esc(_size(b['size']))})</span>"
        )
    if isinstance(value, list) and any(isinstance(v, dict) and set(v) == {"blob"} for v in value):
        return "<ol>" + "".join(f"<li>{_value_html(v, urls, p, e)}</li>" for v in value) + "</ol>"
    return f"<pre>{esc(json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str))}</pre>"


def _coords(ev: dict[str, Any]) -> str:
    bits = []
    if ev.get("step_kind"):
        bits.append(esc(ev["step_kind"]))
    if ev.get("enclosing_step"):
        bits.append(f"in <b>{esc(ev['enclosing_step'])}</b>")
    if ev.get("step"):
        bits.append(f"<b>{esc(ev['step'])}</b>")
    if ev.get("iteration") is not None:
        bits.append(f"iter {esc(ev['iteration'])}")
    if ev.get("fanout_index") is not None:
        bits.append(f"fan-out {esc(ev['fanout_index'])}")
    if ev.get("selector_step"):
        bits.append(f"via {esc(ev['selector_step'])}")
    return " ".join(bits)


def _airflow(ev: dict[str, Any], urls: Urls) -> str:
    if not ev.get("dag_id"):
        return ""
    mi = ev.get("map_index")
    label = f"{ev['dag_id']} · {ev.get('task_id') or ''}" + (f"[{mi}]" if mi is not None and mi >= 0 else "")
    label += f" · try {ev.get('try_number')}" if ev.get("try_number") is not None else ""
    if ev.get("run_id") and ev.get("task_id"):
        href = urls.ti(ev["dag_id"], ev["run_id"], ev["task_id"], -1 if mi is None else mi)
        return f"<a href='{esc(href)}' title='{esc(ev['run_id'])}'>{esc(label)}</a>"
    return esc(label)


def _cursor(cursor: dict[str, Any] | None) -> str:
    if not cursor:
        return "none (starts from the first step)"
    bits = [f"seq {cursor['item_seq']}"]
    if cursor["iteration"] is not None:
        bits.append(f"iteration {cursor['iteration']}")
    if cursor["processor_version"]:
        bits.append(f"processor {cursor['processor_version']}")
    return f"after <b>{esc(cursor['step'])}</b> <span class='muted'>({esc(', '.join(bits))})</span>"


def item_page(data: dict[str, Any], urls: Urls) -> str:
    p, e, iid = data["pipeline"], data["experiment"], data["item_id"]
    st = data["state"]
    cursor = st["cursor"]
    kv = [
        (
            "status",
            _badge("failed" if st["status"] == "running" and st["failures"] else st["status"])
            + (f" <span class='muted'>(lifecycle: {esc(st['status'])})</span>" if st["failures"] else ""),
        ),
        (
            "resume cursor",
            _cursor(cursor),
        ),
        ("open frames", esc(", ".join(str(f["step"]) for f in st["open_frames"])) or "none"),
        ("input fingerprint", f"<code>{esc(st['input_fingerprint'])}</code>"),
        ("processor version", esc(st["processor_version"])),
        ("failures (this version)", _num(st["failures"])),
        ("fencing violations", _num(st["violations"])),
        ("last seq / max epoch", f"{_num(st['last_seq'])} / {_num(st['max_epoch'])}"),
    ]
    if st["filter_reason"] is not None:
        kv.append(("filter reason", f"<code>{esc(json.dumps(st['filter_reason'], default=str))}</code>"))
    if data["parent_item_id"]:
        kv.append(
            (
                "parent",
                f"<a class='mono' href='{esc(urls.item(p, e, data['parent_item_id']))}'>"
                f"{esc(data['parent_item_id'])}</a>",
            )
        )
    state_html = "<dl class='kv'>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in kv) + "</dl>"

    fields = data["fields"]
    fields_html = (
        _table(
            ["Field", "Value"],
            [
                f"<tr><td class='mono'>{esc(k)}</td><td>{_value_html(v, urls, p, e)}</td></tr>"
                for k, v in sorted(fields.items())
            ],
        )
        if fields
        else "<p class='muted'>No folded fields in the current version.</p>"
    )

    fails = data["failures"]
    fail_html = (
        "".join(
            "<div class='card' style='margin:6px 0'>"
            f"<b style='font-size:14px'>{esc(f['error_type'])}</b> {esc(f['message'])}"
            f"<div class='muted'>seq {esc(f['item_seq'])} · step {esc(f['step'])} · writer {esc(f['writer_id'])} "
            f"epoch {esc(f['writer_epoch'])} · {_airflow(f, urls)} · {esc(f['created_at'])}</div>"
            + (
                f"<details><summary>traceback</summary><pre>{esc(f['traceback'])}</pre></details>"
                if f.get("traceback")
                else ""
            )
            + "</div>"
            for f in fails
        )
        or "<p class='muted'>No failures.</p>"
    )

    versions = _table(
        ["Seq", "Input fingerprint", "Processor", "Current", "Written by", "At"],
        [
            f"<tr><td class='num'>{esc(v['item_seq'])}</td><td><code>{esc(v['input_fingerprint'])}</code></td>"
            f"<td>{esc(v['processor_version'])}</td><td>{'yes' if v['current'] else ''}</td>"
            f"<td>{esc(v['writer_id'])}@{esc(v['writer_epoch'])} {_airflow(v, urls)}</td>"
            f"<td class='mono'>{esc(v['created_at'])}</td></tr>"
            for v in data["input_versions"]
        ],
        num=(0,),
    )

    children = data["children"]
    if children:
        more = data["children_total"] - len(children)
        children_html = _table(
            ["Child", "Status", "Failures", "Last seq"],
            [
                f"<tr><td style='padding-left:{8 + 14 * (c['depth'] - 1)}px'>"
                f"<a class='mono' href='{esc(urls.item(p, e, c['item_id']))}'>{esc(c['item_id'])}</a></td>"
                f"<td>{_badge('failed' if c['status'] == 'running' and c['failures'] else c['status'])}</td>"
                f"<td class='num'>{_num(c['failures'])}</td><td class='num'>{_num(c['last_seq'])}</td></tr>"
                for c in children
            ],
            num=(2, 3),
        ) + (f"<p class='muted'>… and {more:,} more</p>" if more > 0 else "")
    else:
        children_html = "<p class='muted'>No fan-out children.</p>"

    erows = []
    for ev in data["events"]:
        if ev["blob"]:
            value = _value_html({"blob": ev["blob"]}, urls, p, e)
        elif ev["value_preview"] is not None:
            value = f"<code>{esc(ev['value_preview'])}</code>"
        elif ev["error_type"]:
            value = f"<b>{esc(ev['error_type'])}</b>: {esc((ev['error_message'] or '')[:300])}"
        else:
            value = ""
        extra = esc(ev["status"]) if ev["event_type"] in ("TERMINAL",) else ""
        if ev["event_type"] == "ITEM_CREATED":
            extra = f"input {_short(ev['input_fingerprint'])}"
        rejected = f" <span class='badge s-failed'>ignored: {esc(ev['rejected'])}</span>" if ev["rejected"] else ""
        erows.append(
            f"<tr{' class=rejected' if ev['rejected'] else ''}><td class='num'>{esc(ev['item_seq'])}</td>"
            f"<td><b>{esc(ev['event_type'])}</b>{rejected}</td><td>{_coords(ev)}</td>"
            f"<td class='mono'>{esc(ev['field'])}</td><td>{value} {extra}</td>"
            f"<td class='mono'>{esc(ev['writer_id'])}@{esc(ev['writer_epoch'])}</td>"
            f"<td>{_airflow(ev, urls)}</td><td class='mono'>{esc(ev['created_at'])}</td></tr>"
        )
    trajectory = _table(
        ["Seq", "Event", "Step", "Field", "Value / detail", "Writer@epoch", "Airflow", "At"], erows, num=(0,)
    )
    api = urls.api(urls.item(p, e, iid))
    body = (
        f"<h1 class='mono'>{esc(iid)}</h1><p class='muted'>{esc(p)} / {esc(e)} · log version "
        f"{_num(data['log_version'])} · <a href='{esc(api)}'>JSON</a></p>"
        f"{state_html}<h2>Fields</h2>{fields_html}<h2>Failures</h2>{fail_html}"
        f"<h2>Input versions</h2>{versions}<h2>Fan-out children ({_num(data['children_total'])})</h2>"
        f"{children_html}<h2>Trajectory ({len(data['events']):,} events)</h2>{trajectory}"
    )
    return page(
        f"{iid} · {p}/{e}",
        body,
        crumbs=[("Experiments", urls.index()), (f"{p} / {e}", urls.experiment(p, e)), (iid, None)],
    )


# --- task instance --------------------------------------------------------------------------------


def _attempt(a: dict[str, Any]) -> str:
    bt = a["by_type"]
    bits = []
    if bt.get("ITEM_CREATED"):
        bits.append("created")
    if a["steps_completed"]:
        bits.append(
            f"steps {esc(', '.join(a['steps_completed'][:6]))}" + ("…" if len(a["steps_completed"]) > 6 else "")
        )
    if a["fields"]:
        bits.append(f"fields {esc(', '.join(a['fields'][:6]))}" + ("…" if len(a["fields"]) > 6 else ""))
    if a["terminal"]:
        bits.append(f"→ {_badge(a['terminal'])}")
    for err in a["errors"][:3]:
        bits.append(
            f"<span class='badge s-failed'>failed</span> <b>{esc(err['error_type'])}</b>: {esc(err['message'][:160])}"
        )
    n = a["events"]
    return (
        f"<div><span class='muted'>{n} event{'' if n == 1 else 's'} (seq {a['first_seq']}–{a['last_seq']}, "
        f"epoch {esc(a['writer_epoch'])})</span> " + "; ".join(bits) + "</div>"
    )


def ti_page(data: dict[str, Any], urls: Urls) -> str:
    mi = data["map_index"]
    title = f"{data['dag_id']} · {data['run_id']} · {data['task_id']}" + (f" [{mi}]" if mi >= 0 else "")
    parts = [
        f"<h1>{esc(data['task_id'])}{esc(f' [{mi}]') if mi >= 0 else ''}</h1>"
        f"<p class='muted'>Dag {esc(data['dag_id'])} · run {esc(data['run_id'])} · "
        f"<a href='{esc(urls.api(urls.ti(data['dag_id'], data['run_id'], data['task_id'], mi)))}'>JSON</a></p>"
    ]
    if not data["experiments"]:
        parts.append(
            "<p class='muted'>This task instance wrote no datagen events (it is not a datagen map task, "
            "it has not started writing yet, or it writes under another connection's root).</p>"
        )
    for exp in data["experiments"]:
        p, e = exp["pipeline"], exp["experiment"]
        tries = exp["tries"]
        rows = []
        for it in exp["items"]:
            by_try = {a["try_number"]: a for a in it["attempts"]}
            cells = "".join(f"<td>{_attempt(by_try[t]) if t in by_try else ''}</td>" for t in tries)
            rows.append(
                f"<tr><td><a class='mono' href='{esc(urls.item(p, e, it['item_id']))}'>{esc(it['item_id'])}</a></td>"
                f"<td>{_badge(it.get('current_status'))}</td>{cells}</tr>"
            )
        headers = ["Item", "Now", *(f"Try {t}" if t is not None else "Try ?" for t in tries)]
        more = exp["items_total"] - len(exp["items"])
        parts.append(
            f"<h2>Experiment <a href='{esc(urls.experiment(p, e))}'>{esc(p)} / {esc(e)}</a></h2>"
            f"<p class='muted'>{exp['items_total']:,} items · {exp['events_total']:,} events written by this "
            f"task instance · tries {esc(', '.join(str(t) for t in tries))}</p>"
            + _table(headers, rows)
            + (f"<p class='muted'>… and {more:,} more items</p>" if more > 0 else "")
        )
    return page(title, "".join(parts), crumbs=[("Experiments", urls.index()), (title, None)])
