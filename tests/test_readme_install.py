"""What the README and the model-step guide promise a new user about installing and versions (issue 24).

Point 14: the README offered ``pip install 'airflow-provider-datagen[llm]'``, a package not published;
it must say how to install from a checkout or a built wheel, with and without the ``llm`` extra.
Point 11's contract: the docs say that editing the model inside a connection keeps the version.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide" / "model-step.md"


def _shell_lines(text: str) -> list[str]:
    """Every line of the ```bash blocks."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    return [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_installs_from_a_checkout_or_a_built_wheel_never_from_an_index() -> None:
    text = README.read_text(encoding="utf-8")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name = project["name"]  # airflow-provider-datagen: not on PyPI
    installs = [line for line in _shell_lines(text) if line.startswith(("pip install", "uv pip install"))]
    assert installs, "the README shows no install command"
    for line in installs:
        # a requirement by name would go to an index that does not have the package
        assert not re.search(rf"['\"]?{re.escape(name)}(\[|['\"]|\s|$)", line), line
        assert not re.search(rf"{re.escape(name.replace('-', '_'))}(\[|['\"]|\s|$)", line), line
    assert "pip install ." in installs  # from a checkout
    wheel = f"dist/{name.replace('-', '_')}-*.whl"
    assert any(line.endswith(wheel) for line in installs), installs  # the built wheel
    assert any("--wheel" in line and "build" in line for line in _shell_lines(text))  # how to build it
    # the llm extra, both ways
    assert "llm" in project["optional-dependencies"]
    assert "pip install '.[llm]'" in installs
    assert any(wheel in line and line.endswith('[llm]"') for line in installs), installs
    assert "not on PyPI" in text


def test_the_model_step_guide_says_a_connection_edit_keeps_the_version() -> None:
    text = " ".join(GUIDE.read_text(encoding="utf-8").split())
    assert "`.version` covers the prompt, instructions, output type, `llm_conn_id`, `model_id`" in text
    assert "editing the model inside a connection keeps the version" in text
    assert "name the model with `model_id=` or bump `processor_version`" in text
    # the README points at that guide for the model step
    assert "guide/model-step/" in README.read_text(encoding="utf-8")
