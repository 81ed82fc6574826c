"""The package's shape, measured: no import cycle of any kind (type-only included), no module over 600
lines, no function over 100 lines, and no read of another object's underscore attribute beyond a few."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tests._support import REPO

if TYPE_CHECKING:
    from pathlib import Path

PACKAGE = REPO / "airflow_provider_datagen"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
MAX_FOREIGN_UNDERSCORE_READS = 15
MAX_PARAMETERS = 10
#: The public entry points whose keyword arguments are the user's contract, as an operator's are: each
#: bundles them into one checked value in its first statement (RunConfig, BatchConfig, the model call).
KEYWORD_CONTRACTS = {
    "airflow_provider_datagen.core.runner.run:run_items",
    "airflow_provider_datagen.core.batch.run:run_batch",
    "airflow_provider_datagen.llm.batch.step:llm_batch",
    "airflow_provider_datagen.llm.process:llm_process",
}

#: Modules of task groups: their ``__init__`` is an operator's keyword contract (DatagenTaskGroup).
TASK_GROUPS = {"airflow_provider_datagen.task_group"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, at any place in it (inside TYPE_CHECKING or a function too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # a package's __init__ naming its own submodules (lazy exports) is not a cycle through them
    for name in graph:
        graph[name] = {
            m for m in graph[name] if not (name == m.rsplit(".", 1)[0] and modules[name].name == "__init__.py")
        }
    assert _cycles(graph) == []


def test_no_module_over_600_lines_and_no_function_over_100() -> None:
    long_modules, long_functions = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append((name, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append((name, node.name, length))
    assert long_modules == [] and long_functions == []


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_function_over_10_parameters_but_operators_and_the_public_entry_points() -> None:
    wide = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for node in cls.body:
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                # an Airflow operator's (or sensor's, or the task group's) __init__ takes its keyword arguments
                airflow_class = name.rsplit(".", 2)[-2] in ("operators", "sensors") or name in TASK_GROUPS
                operator_init = node.name == "__init__" and airflow_class
                if _parameters(node) > MAX_PARAMETERS and not operator_init:
                    wide.append(f"{name}:{cls.name}.{node.name}")
        for node in tree.body:
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and _parameters(node) > MAX_PARAMETERS and f"{name}:{node.name}" not in KEYWORD_CONTRACTS:
                wide.append(f"{name}:{node.name}")
    assert wide == []


def test_few_reads_of_another_objects_underscore_attributes() -> None:
    reads = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            reads.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert len(reads) <= MAX_FOREIGN_UNDERSCORE_READS, reads
