"""The "Datagen status" extra link points at the experiment page under the API server's base URL."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_datagen.links import DatagenStatusLink


@pytest.fixture
def link() -> DatagenStatusLink:
    return DatagenStatusLink()


def test_name_and_xcom_key(link: DatagenStatusLink) -> None:
    assert link.name == "Datagen status"
    assert link.xcom_key == "_link_DatagenStatusLink"


def test_relative_without_base_url(link: DatagenStatusLink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    op = SimpleNamespace(pipeline="qa", experiment="e1")
    assert link.get_link(op, ti_key=None) == "/datagen/experiments/qa/e1"


@pytest.mark.parametrize("base", ["http://127.0.0.1:8080/airflow", "http://127.0.0.1:8080/airflow/"])
def test_absolute_under_base_url(link: DatagenStatusLink, monkeypatch: pytest.MonkeyPatch, base: str) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", base)
    op = SimpleNamespace(pipeline="qa", experiment="e.1-x")
    assert link.get_link(op, ti_key=None) == "http://127.0.0.1:8080/airflow/datagen/experiments/qa/e.1-x"


def test_no_link_without_experiment(link: DatagenStatusLink) -> None:
    assert link.get_link(SimpleNamespace(), ti_key=None) == ""
    assert link.get_link(SimpleNamespace(pipeline="qa", experiment=None), ti_key=None) == ""


def test_link_matches_the_plugin_route(client, ui_log) -> None:
    lg = ui_log("links", "e1")
    with lg.writer("w", 1).batch() as b:
        b.item_created("a", input_fingerprint="f")
    url = DatagenStatusLink().get_link(SimpleNamespace(pipeline="links", experiment="e1"), ti_key=None)
    r = client.get(url)
    assert r.status_code == 200 and "links / e1" in r.text
