"""A budget stop skips the status sensor in its poke and reschedule modes too (issue 24, point 1).

tests/sensors/test_budget_stop.py runs the README's quick-start DAG with the deferrable sensor and the
trigger; the contract names all three modes ("poke, reschedule and deferrable"). The same DAG, with
``deferrable=False`` and each non-deferrable mode, ends the same way: the map tasks, the sensor and the
export skipped, the run a success, the sensor's log naming the budget, the spend and the fix.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from tests.sensors.test_budget_stop import QUICKSTART_DAG, STOP_MESSAGE, _items

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@pytest.mark.parametrize("mode", ["poke", "reschedule"])
def test_budget_stop_skips_the_sensor_in_poke_and_reschedule_modes(
    run_dag_file: Callable[..., Any], tmp_path: Path, capfd: pytest.CaptureFixture[str], mode: str
) -> None:
    import json

    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in _items()))
    dag_id = f"qs_budget_{mode}"
    dag = QUICKSTART_DAG.format(
        dag_id=dag_id, experiment=f"stop_{mode}", source=str(source), destination=str(tmp_path / "out.lance")
    )
    assert dag.count("deferrable=True") == 1
    dag = dag.replace("deferrable=True", f"deferrable=False, mode={mode!r}")
    run = run_dag_file(textwrap.dedent(dag), dag_id)
    states = run.states()
    assert states[("all_done", -1)] == "skipped", states
    assert states[("export", -1)] == "skipped", states
    assert {s for (task, _), s in states.items() if task == "generate"} == {"skipped"}, states
    assert run.state == "success"
    assert run.error("all_done") is None
    logged = capfd.readouterr()
    lines = [line for line in (logged.out + logged.err).splitlines() if "stopped at its budget" in line]
    assert any(STOP_MESSAGE.match(line.split("] ", 1)[-1].split(" [", 1)[0].strip()) for line in lines), lines
    status = run.xcom("all_done", key="datagen_status")
    assert status["stopped_by_budget"] is True
    assert (status["total"], status["completed"], status["running"], status["never_started"]) == (10, 3, 0, 7)
