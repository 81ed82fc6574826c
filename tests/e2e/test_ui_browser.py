"""The datagen plugin in the real Airflow UI, driven by headless Chromium (issue 5, "Tests").

The quickstart example DAG runs in the session's Airflow stack over 40 items in chunks of 20. Some
items fail on their first attempt, so the run fails; the failed ``generate`` map indexes are
cleared over REST and the run then succeeds. Between and after those runs Debian's ``chromium``
(driven by Playwright, no browser download) signs in through SimpleAuthManager's login form, opens
the "Datagen" nav entry (the plugin's index in an iframe), the experiment page (with its spend,
throughput and next-run panels; the next-run panel's classes after the failed run and after the
rerun), the "Datagen" tab of ``generate [0]`` and an item page (its input beside its output, its
usage), and the test asserts the counts and item ids the pages show. A fresh browser context without
the session cookie is refused by the plugin's routes (401). Two experiments of ``llm_process`` over the
same prompts (run in this process against a local OpenAI-compatible server, into the stack's root)
show, on their item pages, each answer's exchange: the request as sent, the reply as received, and
for the second experiment whose reply it reused, with its reused calls on the Spend panel.

Screenshots of every step go to the test's ``tmp_path``, or to ``$DATAGEN_SCREENSHOTS`` when set
(pytest prunes old tmp dirs); their paths are printed (``pytest -s``).
Every Chromium process is recorded by PID and checked to be gone at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import psutil
import pytest

from airflow_provider_datagen.example_dags.fakes import flaky_on_first_attempt, prompts

if TYPE_CHECKING:
    from collections.abc import Iterator

    from playwright.sync_api import Browser, BrowserContext, FrameLocator, Locator, Page

    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

DAG_ID = "datagen_ui_browser"
PIPELINE = "quickstart"  # fixed by the example DAG
EXPERIMENT = "ui_browser"
N_ITEMS = 40
CHUNK = 20
QUICKSTART = Path(__file__).resolve().parents[2] / "airflow_provider_datagen" / "example_dags" / "datagen_quickstart.py"

# Flags that keep Chromium off the network (only 127.0.0.1 is reachable) and work as root.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The plugin's external views (airflow_provider_datagen/plugins/datagen.py): both are named
# "Datagen"; the UI routes them to /plugin/<url_route> (nav) and .../mapped/<i>/plugin/<url_route>
# (task-instance tab) and renders each as <iframe title="Datagen">.
VIEW_NAME = "Datagen"
IFRAME = f"iframe[title='{VIEW_NAME}']"
UI_TIMEOUT_MS = 20_000


def quickstart_dag_source() -> str:
    """The example DAG with its own dag_id, experiment and sizes (each substitution must apply once)."""
    source = QUICKSTART.read_text()
    substitutions = {
        'dag_id="datagen_quickstart"': f'dag_id="{DAG_ID}"',
        'os.environ.get("DATAGEN_QUICKSTART_EXPERIMENT", "demo")': repr(EXPERIMENT),
        'int(os.environ.get("DATAGEN_QUICKSTART_ITEMS", "200"))': str(N_ITEMS),
        'int(os.environ.get("DATAGEN_QUICKSTART_CHUNK", "50"))': str(CHUNK),
        # the quickstart retries its fake model's timeouts in place; this story needs a failed run,
        # so its flaky items raise an error the policy does not retry (as in make demo)
        '"airflow_provider_datagen.example_dags.fakes:fake_model"': (
            '"airflow_provider_datagen.example_dags.fakes:fake_model_with_refusals"'
        ),
    }
    for old, new in substitutions.items():
        assert source.count(old) == 1, f"{QUICKSTART.name} changed: {old!r} is not there exactly once"
        source = source.replace(old, new)
    return source


def chromium_path() -> str | None:
    return os.environ.get("DATAGEN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium_pids() -> set[int]:
    pids = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "chrom" in child.name().lower():
                pids.add(child.pid)
    return pids


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium through Playwright; every Chromium PID it ever had is gone afterwards."""
    executable = chromium_path()
    if executable is None:
        pytest.fail("Debian's chromium is not installed: run `make chromium` (make test does it first)")
    from playwright.sync_api import sync_playwright

    before = _chromium_pids()
    seen: set[int] = set()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        seen |= _chromium_pids() - before
        try:
            yield browser
        finally:
            seen |= _chromium_pids() - before  # renderers started since launch
            browser.close()
    # Playwright has closed the browser and stopped its driver; anything left is killed by PID.
    deadline = time.monotonic() + 10
    alive = {pid for pid in seen if psutil.pid_exists(pid)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {pid for pid in alive if _alive(pid)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not alive, f"Chromium processes {sorted(alive)} outlived the browser and were SIGKILLed"
    print(f"\nbrowser: all {len(seen)} Chromium processes seen ({sorted(seen)}) have exited")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Shots:
    """Numbered screenshots under the test's tmp dir."""

    def __init__(self, directory: Path) -> None:
        kept = os.environ.get("DATAGEN_SCREENSHOTS")
        if kept:
            directory = Path(kept) / directory.name
            directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.paths: list[Path] = []

    def take(self, page: Page, name: str) -> Path:
        path = self.directory / f"{len(self.paths) + 1:02d}-{name}.png"
        page.screenshot(path=str(path))
        self.paths.append(path)
        print(f"screenshot: {path}")
        return path

    def element(self, locator: Locator, name: str) -> Path:
        """A screenshot of one element (a panel), scrolled into view."""
        path = self.directory / f"{len(self.paths) + 1:02d}-{name}.png"
        locator.scroll_into_view_if_needed()
        locator.screenshot(path=str(path))
        self.paths.append(path)
        print(f"screenshot: {path}")
        return path


def new_context(browser: Browser, base_url: str) -> tuple[BrowserContext, list[str], list[str]]:
    """A browser context that can reach only the api-server; returns it with two recorders.

    The first list collects requests to anywhere else (they are aborted), the second any response
    of the plugin's routes with an error status.
    """
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(UI_TIMEOUT_MS)
    offsite: list[str] = []
    plugin_errors: list[str] = []

    def guard(route):  # type: ignore[no-untyped-def]
        url = route.request.url
        if url.startswith((base_url + "/", "data:", "blob:")):
            route.continue_()
        else:
            offsite.append(url)
            route.abort()

    context.route("**/*", guard)

    def on_response(response):  # type: ignore[no-untyped-def]
        if response.url.startswith(base_url + "/datagen/") and response.status >= 400:
            plugin_errors.append(f"{response.status} {response.url}")

    context.on("response", on_response)
    return context, offsite, plugin_errors


def log_in(page: Page, client: AirflowClient, shots: Shots) -> None:
    """SimpleAuthManager's login form: the UI redirects to /auth/login?next=/ when signed out."""
    page.goto(client.base_url + "/")
    page.wait_for_url(re.compile(r"/auth/login"))
    username = page.locator("input[name='username']")
    username.wait_for()
    shots.take(page, "login-form")
    username.fill(client.username)
    page.locator("input[name='password']").fill(client.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(client.base_url + "/")
    page.get_by_test_id("nav-sidebar").wait_for()
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert "_token" in cookies, f"no session cookie after signing in: {sorted(cookies)}"


def open_nav_view(page: Page) -> FrameLocator:
    """Click the plugin's top-level nav entry; return the iframe once the index has rendered."""
    page.get_by_test_id("nav-sidebar").get_by_role("link", name=VIEW_NAME, exact=True).click()
    page.wait_for_url(re.compile(r"/plugin/datagen$"))
    frame = page.frame_locator(IFRAME)
    frame.locator("h1", has_text="Datagen experiments").wait_for()
    return frame


def table_rows(table: Locator) -> list[dict[str, str]]:
    """A rendered HTML table as {header: cell text} dicts."""
    headers = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    rows = []
    for row in table.locator("tbody tr").all():
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        rows.append(dict(zip(headers, cells, strict=False)))
    return rows


def experiment_row(frame: FrameLocator) -> dict[str, str]:
    rows = [r for r in table_rows(frame.locator("table")) if r.get("Experiment") == EXPERIMENT]
    assert len(rows) == 1, f"experiment {EXPERIMENT} not listed once on the index: {rows}"
    return rows[0]


def cards(frame: FrameLocator) -> dict[str, int]:
    """The experiment page's count cards ({label: number}); the first row of cards (spend has its own)."""
    out = {}
    for card in frame.locator(".cards").first.locator(".card").all():
        out[card.locator(".muted").inner_text().strip()] = int(card.locator("b").inner_text().replace(",", ""))
    return out


#: The next-run panel's rows (the planner's classes) when a rerun would do nothing.
NO_RERUN = {"fresh": 0, "replay": 0, "failed": 0, "edited": 0, "demoted": 0, "skip": 0}


def next_run_counts(frame: FrameLocator) -> dict[str, int]:
    """The next-run panel as {class: source items} (each row reads "<class>: what a rerun does")."""
    rows = table_rows(frame.locator("h2#next-run + table"))
    return {r["What a rerun does"].split(":")[0]: int(r["Source items"].replace(",", "")) for r in rows}


def test_nav_view_experiment_page_and_task_instance_tab(
    airflow_stack: AirflowClient, browser: Browser, tmp_path: Path
) -> None:
    started = time.monotonic()
    client = airflow_stack
    shots = Shots(tmp_path)
    flaky = {p["id"] for p in prompts(N_ITEMS) if flaky_on_first_attempt(p["id"])}
    assert flaky, "the example's fake model no longer fails any of the first items; pick a larger N_ITEMS"

    # -- the quickstart run: fails on the flaky items --------------------------------------------------
    client.add_dag_file(quickstart_dag_source(), f"{DAG_ID}.py")
    client.wait_dag_parsed(DAG_ID, timeout=120)
    client.unpause(DAG_ID)
    run_id = client.trigger(DAG_ID)
    assert client.wait_run(DAG_ID, run_id, timeout=180) == "failed"
    chunks = [entry["chunk"]["item_ids"] for entry in client.xcom(DAG_ID, run_id, "plan")]
    assert [len(c) for c in chunks] == [CHUNK] * (N_ITEMS // CHUNK)
    failed = sorted(
        t["map_index"]
        for t in client.task_instances(DAG_ID, run_id)
        if t["task_id"] == "generate" and t["state"] == "failed"
    )
    assert failed == [i for i, ids in enumerate(chunks) if flaky & set(ids)]
    # what a failed CI run prints: each failed chunk with the error its task log ends on
    failures = client.failures(DAG_ID, run_id)
    assert failures.count("ItemsFailedError: ") == len(failed), failures
    assert "Clear this task instance to rerun only the pending items" in failures

    context, offsite, plugin_errors = new_context(browser, client.base_url)
    page = context.new_page()
    log_in(page, client, shots)
    shots.take(page, "home-signed-in")

    frame = open_nav_view(page)
    row = experiment_row(frame)
    shots.take(page, "nav-index-after-failed-run")
    # A failed item is still "running" in its lifecycle (it has failures and no terminal event); the
    # index shows it under Failed only, and Running counts the running items that have not failed.
    assert (row["Pipeline"], row["Items"], row["Completed"], row["Failed"], row["Running"], row["Done"]) == (
        PIPELINE,
        str(N_ITEMS),
        str(N_ITEMS - len(flaky)),
        str(len(flaky)),
        "0",
        f"{100.0 * (N_ITEMS - len(flaky)) / N_ITEMS:.1f}%",
    ), row

    # The experiment page's next-run panel: the planner's classification of the source the plan task
    # recorded (the DAG's inline list): the flaky items would be retried, the rest skipped.
    frame.get_by_role("link", name=EXPERIMENT, exact=True).click()
    frame.locator("h1", has_text=f"{PIPELINE} / {EXPERIMENT}").wait_for()
    assert next_run_counts(frame) == {**NO_RERUN, "failed": len(flaky), "skip": N_ITEMS - len(flaky)}
    assert "The planner's classification of the 40 items of the source the last plan read" in (
        frame.locator("#next-run-source").inner_text()
    )
    shots.element(frame.locator("h2#next-run + table"), "panel-next-run-after-failed-run")

    # -- clear the failed map indexes: only the flaky items run again, the run succeeds ---------------
    cleared = client.clear(DAG_ID, run_id, [("generate", i) for i in failed], include_downstream=True)
    assert {(t["task_id"], t["map_index"]) for t in cleared} >= {("generate", i) for i in failed}
    client.wait_success(DAG_ID, run_id, timeout=180)

    # The nav view again, loaded afresh (the iframe is on the experiment page, deep-linked in the
    # UI's URL): everything completed, nothing failed now.
    page.goto(client.base_url + "/plugin/datagen")
    frame = page.frame_locator(IFRAME)
    frame.locator("h1", has_text="Datagen experiments").wait_for()
    row = experiment_row(frame)
    shots.take(page, "nav-index-after-rerun")
    assert (row["Items"], row["Completed"], row["Failed"], row["Running"], row["Done"]) == (
        str(N_ITEMS),
        str(N_ITEMS),
        "0",
        "0",
        "100.0%",
    ), row

    # -- the experiment page, by its link inside the iframe -----------------------------------------------
    frame.get_by_role("link", name=EXPERIMENT, exact=True).click()
    frame.locator("h1", has_text=f"{PIPELINE} / {EXPERIMENT}").wait_for()
    # The UI mirrors the iframe's path into its own URL (a deep link to this page).
    page.wait_for_url(re.compile(rf"/plugin/datagen/datagen/experiments/{PIPELINE}/{EXPERIMENT}$"))
    shots.take(page, "experiment-page")
    counts = cards(frame)
    assert counts["items"] == N_ITEMS, counts
    assert counts["completed"] == N_ITEMS, counts
    assert counts["failed items"] == 0, counts
    assert counts["running"] == 0 and counts["never started"] == 0, counts
    # The failures of the first attempts stay on record, one row per flaky item.
    failures = table_rows(frame.locator("h2:has-text('Failures') + table"))
    assert sorted(f["Item"] for f in failures) == sorted(flaky), failures
    assert all(f["Try"] == "1" and "ModelRequestError" in f["Error"] for f in failures), failures
    assert {f["Resolved"] for f in failures} == {"resolved"}, failures  # the rerun completed every one
    assert frame.locator(".pager").first.inner_text().strip() == f"1–{N_ITEMS} of {N_ITEMS}"
    items = table_rows(frame.locator(".pager + table"))
    assert [i["Item"] for i in items] == [p["id"] for p in prompts(N_ITEMS)]
    assert {i["Status"] for i in items} == {"completed"}

    # The panels: spend (the fake model may or may not report usage), throughput, next run.
    spend = frame.locator("h2#spend")
    spend_text = frame.locator("h2#spend + *").inner_text()
    assert "No usage recorded" in spend_text or "spent" in spend_text, spend_text
    shots.element(frame.locator("h2#spend + *"), "panel-spend")
    chart = frame.locator("svg.chart")
    assert chart.locator("rect.completed").count() >= 1
    # the first attempts' failures are on the chart too
    assert chart.locator("rect.failed").count() >= 1
    shots.element(chart, "panel-throughput-chart")
    assert next_run_counts(frame) == {**NO_RERUN, "skip": N_ITEMS}
    shots.element(frame.locator("h2#next-run + table"), "panel-next-run")
    spend.scroll_into_view_if_needed()
    shots.take(page, "experiment-page-panels")

    # A reload of that deep link lands on the same page inside the iframe.
    page.reload()
    page.frame_locator(IFRAME).locator("h1", has_text=f"{PIPELINE} / {EXPERIMENT}").wait_for()

    # -- the task instance generate [0] and its "Datagen" tab -----------------------------------------------
    ti_url = f"{client.base_url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/generate/mapped/0"
    page.goto(ti_url)
    tab = page.locator(f"a[title='{VIEW_NAME}']")
    tab.wait_for()
    assert (tab.get_attribute("href") or "").endswith("/tasks/generate/mapped/0/plugin/datagen-ti")
    shots.take(page, "task-instance-generate-0")
    tab.click()
    page.wait_for_url(re.compile(r"/tasks/generate/mapped/0/plugin/datagen-ti$"))
    frame = page.frame_locator(IFRAME)
    frame.locator("h1", has_text="generate [0]").wait_for()
    shots.take(page, "task-instance-datagen-tab")
    chunk = chunks[0]
    summary = frame.locator("h2:has-text('Experiment') + p").inner_text()
    assert summary.startswith(f"{len(chunk)} items · "), summary
    assert summary.endswith("tries 1, 2"), summary
    assert f"run {run_id}" in frame.locator("h1 + p").inner_text()
    ti_rows = table_rows(frame.locator("h2:has-text('Experiment') + p + table"))
    assert [r["Item"] for r in ti_rows] == chunk
    assert {r["Now"] for r in ti_rows} == {"completed"}
    for r in ti_rows:
        if r["Item"] in flaky:
            # Failed on try 1, completed on try 2 (the clear reran only these).
            assert "ModelRequestError" in r["Try 1"] and "completed" in r["Try 2"], r
        else:
            assert "completed" in r["Try 1"] and r["Try 2"] == "", r

    # A rerun item's row, then its item page (the link navigates inside the tab's iframe).
    rerun_item = min(flaky & set(chunk))
    link = frame.get_by_role("link", name=rerun_item, exact=True)
    link.scroll_into_view_if_needed()
    shots.take(page, f"task-instance-datagen-tab-{rerun_item}")
    link.click()
    frame.locator("h1", has_text=rerun_item).wait_for()
    assert "ModelRequestError" in frame.locator("body").inner_text()
    shots.take(page, f"item-page-{rerun_item}")
    # Its input (the plan stored the DAG's inline source beside the log) beside its output fields.
    prompt = next(p for p in prompts(N_ITEMS) if p["id"] == rerun_item)
    input_text = frame.locator("#input pre").inner_text()
    assert prompt["prompt"] in input_text, input_text
    assert frame.locator("#output table tbody tr").count() >= 1
    shots.element(frame.locator(".cols"), f"item-input-output-{rerun_item}")
    # The fake model reports usage: one row per attempt, the failed one of the first run and the
    # completed one of the rerun, with the totals above them.
    summary = frame.locator("h2#usage + p")
    assert " calls · " in summary.inner_text(), summary.inner_text()
    attempts = frame.locator("h2#usage + p + table tbody tr")
    assert attempts.count() == 2
    assert [attempts.nth(i).locator("td").nth(2).inner_text() for i in range(2)] == ["failed", "completed"]
    shots.element(frame.locator("h2#usage + p + table"), f"item-usage-{rerun_item}")

    # The plugin's page straight from the api-server, with the session cookie: allowed.
    response = page.goto(f"{client.base_url}/datagen/")
    assert response is not None and response.status == 200
    shots.take(page, "plugin-index-direct")

    assert not plugin_errors, f"plugin routes answered with errors while browsing: {plugin_errors}"
    if offsite:
        print(f"aborted off-site requests: {offsite}")
    context.close()
    print(f"ui browser test: {time.monotonic() - started:.1f} s, screenshots in {shots.directory}")


def test_the_item_page_shows_the_exchange_behind_each_answer(
    airflow_stack: AirflowClient, browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two experiments of ``llm_process`` over the same prompts, run in this process against a local
    OpenAI-compatible server into the stack's root: the first pays, the second is answered from the
    response store. The api-server's item pages, in Chromium, show each answer's exchange: the request
    as sent, the reply as received and, for the second, whose reply it reused; the Spend panel counts
    the reused calls."""
    from airflow_provider_datagen.core import CheckpointLog, run_items
    from airflow_provider_datagen.llm import llm_process
    from tests._support import openai_server

    client = airflow_stack
    shots = Shots(tmp_path)
    root = str(client.stack.settings.home / "datagen")  # the api-server's root: no datagen connection
    pipeline, items = "exchanges", [{"id": f"x{k}", "text": f"tide table {k}"} for k in range(3)]
    fake = openai_server.start()
    try:
        conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
        conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
        monkeypatch.setenv("AIRFLOW_CONN_LLM_EXCHANGES", json.dumps(conn))
        process = llm_process("Repeat {{ text }}", llm_conn_id="llm_exchanges")
        for experiment in ("paid", "reused"):
            log = CheckpointLog.open(root, pipeline=pipeline, experiment=experiment)
            report = run_items(log, items, process, processor_version=process.version)
            assert report.failed == [] and len(report.processed) == len(items), report
        assert sum(1 for r in fake.requests if r.status == 200) == len(items)  # the second paid nothing
    finally:
        fake.stop()

    context, offsite, plugin_errors = new_context(browser, client.base_url)
    page = context.new_page()
    log_in(page, client, shots)
    for experiment in ("paid", "reused"):
        page.goto(f"{client.base_url}/plugin/datagen/datagen/experiments/{pipeline}/{experiment}")
        frame = page.frame_locator(IFRAME)
        frame.locator("h1", has_text=f"{pipeline} / {experiment}").wait_for()
        if experiment == "reused":
            assert frame.locator("#reused-calls").inner_text() == str(len(items))
            shots.element(frame.locator("h2#spend + *"), "exchange-spend-reused")
        link = frame.get_by_role("link", name="x1", exact=True)
        link.scroll_into_view_if_needed()
        link.click()
        frame.locator("h1", has_text="x1").wait_for()
        card = frame.locator(".card.exchange")
        assert card.count() == 1
        # one line each (an exchange's labels are inline, not a figure card's block numbers)
        head = card.locator("div").first.inner_text()
        assert head.startswith("reused · " if experiment == "reused" else "sent · "), head
        card.locator("details.request > summary").click()  # the request as sent, folded by default
        request = card.locator("details.request").inner_text()
        assert "Repeat tide table 1" in request and "user" in request, request
        assert fake.base_url in request, request  # where it was sent
        reply = card.locator("details.reply pre").inner_text()
        assert json.loads(reply)["choices"][0]["message"]["content"] == "echo: Repeat tide table 1", reply
        assert "\n  " in reply  # pretty-printed
        made = card.locator(".reused-from")
        if experiment == "reused":
            assert re.fullmatch(rf"reused from {pipeline}/paid, 20\d\d-\d\d-\d\dT[\d:.]+\+00:00", made.inner_text()), (
                made.inner_text()
            )
        else:
            assert made.count() == 0
        card.scroll_into_view_if_needed()
        shots.element(card, f"exchange-{experiment}-x1")
    assert not plugin_errors, f"plugin routes answered with errors while browsing: {plugin_errors}"
    if offsite:
        print(f"aborted off-site requests: {offsite}")
    context.close()


def test_plugin_pages_without_session_are_refused(
    airflow_stack: AirflowClient, browser: Browser, tmp_path: Path
) -> None:
    """No ``_token`` cookie and no bearer token: the plugin app answers 401, not a page."""
    client = airflow_stack
    shots = Shots(tmp_path)
    context, _, _ = new_context(browser, client.base_url)
    page = context.new_page()
    assert not context.cookies()
    for path in ("/datagen/", f"/datagen/experiments/{PIPELINE}/{EXPERIMENT}", "/datagen/ti/d/r/t/0"):
        response = page.goto(client.base_url + path)
        assert response is not None
        assert response.status == 401, (path, response.status, response.text()[:500])
        assert response.json() == {"detail": "Not authenticated"}
    shots.take(page, "plugin-without-session-401")
    context.close()
