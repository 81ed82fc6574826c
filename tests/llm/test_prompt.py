"""The prompt template: rendered from an item's fields, a missing field an error naming it."""

from __future__ import annotations

import pytest

from airflow_provider_datagen.exceptions import ConfigurationError, PromptTemplateError
from airflow_provider_datagen.llm.prompt import PromptTemplate


def test_renders_the_items_fields_and_earlier_steps_fields_win() -> None:
    t = PromptTemplate("Translate {{ text }} into {{ lang }}{% for w in range(2) %}!{% endfor %}\n")
    assert t.names == {"text", "lang"}
    assert t.render({"text": "hi", "lang": "fr"}, {}, "k1") == "Translate hi into fr!!\n"
    # a field set by an earlier step is newer than the input field of the same name
    assert t.render({"text": "hi", "lang": "fr"}, {"lang": "de"}, "k1") == "Translate hi into de!!\n"


def test_a_missing_field_names_the_field_and_the_item() -> None:
    t = PromptTemplate("Translate {{ text }} into {{ lang }}")
    with pytest.raises(
        PromptTemplateError,
        match=r"^item 'k7': the prompt names field 'lang' the item does not have \(it has \['id', 'text'\]\); "
        "add the field to the items, or change the prompt$",
    ):
        t.render({"id": "k7", "text": "hi"}, {}, "k7")
    with pytest.raises(PromptTemplateError, match=r"names fields \['lang', 'text'\] the item does not have"):
        t.render({"id": "k7"}, {}, "k7")


def test_a_missing_attribute_is_a_prompt_error_too() -> None:
    t = PromptTemplate("{{ meta.lang }}")
    with pytest.raises(
        PromptTemplateError, match=r"^item 'k1': the prompt could not be rendered: UndefinedError: .*'lang'"
    ):
        t.render({"meta": {"other": 1}}, {}, "k1")


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("", r"is not a non-empty string"),
        (None, r"is not a non-empty string"),
        ("{{ text ", r"is not a valid Jinja2 template \(unexpected end of template.*line 1\)"),
    ],
)
def test_a_bad_template_is_refused_when_built(source: object, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^llm_process: prompt=.* {problem}"):
        PromptTemplate(source)
