"""The wheel ships the provider only: every file of the package, and nothing of dev/, benchmarks/, tests/, docs/.

The wheel is built without build isolation (hatchling is a dev dependency), so nothing is downloaded.
``make wheel-check`` goes further: it installs the wheel into a fresh venv and lists the providers.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import airflow_provider_datagen

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(airflow_provider_datagen.__file__).resolve().parent


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "build",
            "--wheel",
            "--no-build-isolation",
            "--python",
            sys.executable,
            "--out-dir",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("airflow_provider_datagen-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _package_files() -> set[str]:
    return {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_wheel_holds_exactly_the_package_and_its_metadata(wheel_files: set[str]) -> None:
    package = {name for name in wheel_files if not name.startswith("airflow_provider_datagen-")}
    assert package == _package_files()
    # Package data travels too: the typing marker (and the UI's templates, whatever the package holds).
    assert "airflow_provider_datagen/py.typed" in package
    metadata = {name.rsplit("/", 1)[-1] for name in wheel_files - package}
    assert {"METADATA", "WHEEL", "entry_points.txt", "RECORD"} <= metadata


def test_the_wheel_has_no_development_tooling(wheel_files: set[str]) -> None:
    top_level = {name.split("/", 1)[0] for name in wheel_files}
    assert top_level == {"airflow_provider_datagen", *(n for n in top_level if n.endswith(".dist-info"))}
    tooling = [n for n in wheel_files if any(w in n.rsplit("/", 1)[-1] for w in ("devserver", "demo", "bench"))]
    assert tooling == []


def test_the_example_dags_and_their_fakes_are_installed(wheel_files: set[str]) -> None:
    assert {
        "airflow_provider_datagen/example_dags/datagen_quickstart.py",
        "airflow_provider_datagen/example_dags/datagen_pipeline.py",
        "airflow_provider_datagen/example_dags/fakes.py",
        "airflow_provider_datagen/example_dags/datagen_llm.py",
        "airflow_provider_datagen/example_dags/datagen_task_group.py",
        "airflow_provider_datagen/llm/__init__.py",
        "airflow_provider_datagen/llm/process.py",
    } <= wheel_files
