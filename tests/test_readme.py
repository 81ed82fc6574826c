"""The README's examples run as written: a new user's DAG copied from it, and the library-only block.

The code blocks are read from README.md and only their placeholders are replaced (the source file,
the process, the output paths), so the README keeps examples a user can copy verbatim.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lance

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _block(title: str, containing: str) -> str:
    blocks = [b for b in _BLOCK.findall(_section(title)) if containing in b]
    assert len(blocks) == 1, f"README section {title!r} should hold one python block with {containing!r}"
    return blocks[0]


def _substitute(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        # each placeholder once, exactly as written: a README edit must update this test knowingly
        assert code.count(old) == 1, f"placeholder {old!r} found {code.count(old)} times in the README block"
        code = code.replace(old, new)
    return code


def test_quick_start_dag_runs_as_written(
    run_dag_file: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls.tsv"
    monkeypatch.setenv("DATAGEN_TEST_CALLS", str(calls))
    prompts = [{"id": f"p{i:03d}", "prompt": f"what is {i} plus {i}?"} for i in range(230)]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in prompts), encoding="utf-8")
    destination = tmp_path / "results" / "qa_e1.lance"
    dag = _substitute(
        _block("Quick start", "with DAG("),
        {
            '"/data/prompts.jsonl"': repr(str(source)),
            '"my_pkg.model:answer"': repr("tests._support.procs:readme_answer"),
            '"/data/results/qa_e1.lance"': repr(str(destination)),
        },
    )

    run = run_dag_file(dag, "my_generation")

    assert run.state == "success", run.states()
    states = run.states()
    # the task group's tasks, prefixed by its id
    assert {k[0] for k in states} == {"qa.plan", "qa.generate", "qa.all_done", "qa.export"}
    assert [k for k in states if k[0] == "qa.generate"] == [("qa.generate", 0), ("qa.generate", 1), ("qa.generate", 2)]
    assert set(states.values()) == {"success"}
    # the README's promise: mapped instances are named by their chunk's key range
    labels = [ti.rendered_map_index for ti in run.task_instances() if ti.task_id == "qa.generate"]
    assert labels == ["p000 … p099 (100 items)", "p100 … p199 (100 items)", "p200 … p229 (30 items)"]
    status = run.xcom("qa.all_done")
    assert (status["total"], status["completed"], status["pending"], status["failed_items"]) == (230, 230, 0, 0)
    assert run.xcom("qa.export")["rows"] == len(prompts)
    # every item invoked exactly once, on its first attempt
    invoked = collections.Counter(calls.read_text().splitlines())
    assert invoked == collections.Counter(f"{p['id']}\t1" for p in prompts)
    table = lance.dataset(str(destination)).to_table()
    assert table.num_rows == len(prompts)
    assert sorted(table["item_id"].to_pylist()) == [p["id"] for p in prompts]


def test_without_airflow_block_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    code = _substitute(
        _block("Without Airflow", "run_items("),
        {'"/data/root"': repr(str(tmp_path / "root")), '"/data/out.lance"': repr(str(tmp_path / "out.lance"))},
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md (Without Airflow)", "exec"), {"__name__": "readme_without_airflow"})
    printed = out.getvalue().splitlines()
    # the prints show what their comments say
    comments = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]
    assert len(printed) == len(comments) == 3
    report = ast.literal_eval(printed[0])
    assert report == ast.literal_eval(comments[0])
    status = ast.literal_eval(printed[1])
    assert (status["total"], status["completed"], status["pending"]) == (100, 100, 0)
    export = ast.literal_eval(printed[2])
    assert export["rows"] == ast.literal_eval(comments[2])["rows"] == 100
    assert re.fullmatch(r"[0-9a-f]{64}", export["fingerprint"])


#: the documentation site (mkdocs.yml's site_url); the README links into it, since it is also the PyPI page
DOCS_URL = "https://airflow-provider-datagen.readthedocs.io/en/latest/"
_LINK = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)|(?:href|src)=\"([^\"]+)\"", re.M)


def _links(text: str) -> list[str]:
    return [next(g for g in m.groups() if g) for m in _LINK.finditer(text)]


def _slug(heading: str) -> str:
    # Python-Markdown's toc slugify, which MkDocs uses for heading anchors
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_is_a_landing_page_of_at_most_300_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_readme_links_are_absolute_so_they_work_on_pypi() -> None:
    links = _links(README.read_text(encoding="utf-8"))
    assert links, "the README links to its documentation"
    assert [link for link in links if not link.startswith("https://")] == []


def test_readme_links_into_the_docs_name_pages_and_headings_that_exist() -> None:
    docs = README.parent / "docs"
    site_url = re.search(r"^site_url:\s*(\S+)", (README.parent / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert site_url is not None and site_url.group(1) == DOCS_URL
    into_docs = [link for link in _links(README.read_text(encoding="utf-8")) if link.startswith(DOCS_URL)]
    assert len(into_docs) >= 10
    for link in into_docs:
        path, _, anchor = link.removeprefix(DOCS_URL).partition("#")
        path = path.strip("/")
        candidates = [docs / "index.md"] if not path else [docs / f"{path}.md", docs / path / "index.md"]
        pages = [p for p in candidates if p.is_file()]
        assert pages, f"{link}: no page {' or '.join(str(c.relative_to(docs)) for c in candidates)} under docs/"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", pages[0].read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{link}: no such heading in {pages[0].name}"


def test_the_guides_quick_start_holds_the_readmes_dag_verbatim() -> None:
    guide = (README.parent / "docs" / "guide" / "quickstart.md").read_text(encoding="utf-8")
    assert _block("Quick start", "with DAG(") in _BLOCK.findall(guide)
