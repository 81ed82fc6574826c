"""``process=``: a dotted path that cannot be resolved fails the map task, naming what is missing."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.exceptions import ConfigurationError
from tests._support.ops_dag import ops_dag, ops_log, sample_items

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_unknown_process_path_fails_the_task_naming_it(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    from airflow_provider_datagen.operators.datagen import resolve_process

    for bad, needle in (
        ("tests._support.nope:fn", "names a module it cannot import: module 'tests._support.nope'"),
        ("tests._support.procs:missing", "names a missing attribute: module 'tests._support.procs' has no attribute"),
        ("tests._support.procs:not_callable", "is a int, not a callable or a Step; "),
    ):
        with pytest.raises(ConfigurationError, match=f"^DatagenMapOperator: process={re.escape(repr(bad))} {needle}"):
            resolve_process(bad)
    run = run_dag_file(
        ops_dag(
            "ops_badproc", tmp_path, source=sample_items(3), experiment="badproc", process="tests._support.nope:fn"
        ),
        "ops_badproc",
    )
    assert run.state == "failed"
    run.assert_failed(
        "generate",
        ConfigurationError,
        r"^DatagenMapOperator: process='tests\._support\.nope:fn' names a module it cannot import",
        map_index=0,
    )
    assert not calls.exists()
    assert not ops_log("badproc").exists()
