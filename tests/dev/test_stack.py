"""The airflow.cfg the dev stack leaves in its home says what its components run with."""

from __future__ import annotations

import configparser
import subprocess
from typing import TYPE_CHECKING, Any

from dev import stack as stack_module
from dev.stack import AirflowStack, StackSettings, write_config

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

# What Airflow writes into a new home (abridged): defaults, comments, a generated Fernet key.
DEFAULT_CFG = """[core]
# The folder where your airflow pipelines live
dags_folder = {home}/dags
fernet_key = generated-fernet-key
# executor =
load_examples = True

[database]
sql_alchemy_conn = sqlite:///{home}/airflow.db

[api_auth]
jwt_secret = random-default
"""


def _airflow_settings(env: dict[str, str]) -> dict[tuple[str, str], str]:
    return {
        (parts[1].lower(), parts[2].lower()): value
        for name, value in env.items()
        if len(parts := name.split("__")) == 3 and parts[0] == "AIRFLOW"
    }


def test_prepare_leaves_an_airflow_cfg_matching_the_components_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    settings = StackSettings(home=home, dags_folder=tmp_path / "example_dags", port=18080)

    def fake_migrate(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        # `airflow db migrate` in a new home: Airflow writes its default airflow.cfg
        (home / "airflow.cfg").write_text(DEFAULT_CFG.format(home=home))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(stack_module.subprocess, "run", fake_migrate)
    stack = AirflowStack(settings)
    stack.prepare()

    text = (home / "airflow.cfg").read_text()
    cfg = configparser.ConfigParser()  # interpolating, as Airflow reads it
    cfg.read_string(text)
    for (section, key), value in _airflow_settings(stack.env).items():
        assert cfg.get(section, key) == value, (section, key)
    assert cfg.get("core", "dags_folder") == str(tmp_path / "example_dags")
    assert cfg.get("core", "fernet_key") == "generated-fernet-key"  # Airflow's own lines are kept
    assert "# The folder where your airflow pipelines live" in text
    assert text.count("dags_folder =") == 1


def test_write_config_escapes_percent_and_adds_missing_sections(tmp_path: Path) -> None:
    path = tmp_path / "airflow.cfg"
    path.write_text("[core]\ndags_folder = /old\n")
    write_config(
        path, {"AIRFLOW__CORE__DAGS_FOLDER": "/new", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "pg://u:p%40@h/db"}
    )
    cfg = configparser.ConfigParser()
    cfg.read(path)
    assert cfg.get("core", "dags_folder") == "/new"
    assert cfg.get("database", "sql_alchemy_conn") == "pg://u:p%40@h/db"
