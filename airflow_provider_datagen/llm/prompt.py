"""The prompt of a model step: a Jinja2 template rendered from an item's fields.

Compiled once, when the step is built (a syntax error is a ``ConfigurationError`` when the DAG is
parsed); rendered per item with ``StrictUndefined``, so a field the item lacks is an error naming it
rather than an empty string sent to a paid model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.meta

from airflow_provider_datagen.exceptions import PromptTemplateError, bad_argument

if TYPE_CHECKING:
    from collections.abc import Mapping

# Prompts are plain text, not HTML: no autoescaping; a trailing newline the author wrote is kept.
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)


class PromptTemplate:
    """A compiled prompt template; :meth:`render` fills it from an item's fields.

    :param source: the Jinja2 template text, e.g. ``"Translate into French: {{ text }}"``.
    :param owner: who is building it, for the error message of a bad template.
    :param what: what the template is, in its errors: ``"prompt"`` or ``"sample"`` (``sample=``).
    """

    def __init__(self, source: Any, owner: object = "llm_process", what: str = "prompt") -> None:
        self.what = what
        if not isinstance(source, str) or not source.strip():
            raise bad_argument(
                owner,
                what,
                source,
                "is not a non-empty string",
                "give a Jinja2 template, e.g. 'Summarise: {{ text }}'",
            )
        try:
            self._template = _ENV.from_string(source)
            #: the top-level names the template reads (the item fields it needs)
            self.names = frozenset(jinja2.meta.find_undeclared_variables(_ENV.parse(source))).difference(_ENV.globals)
        except jinja2.TemplateSyntaxError as exc:
            raise bad_argument(
                owner, what, source, f"is not a valid Jinja2 template ({exc.message}, line {exc.lineno})", "fix it"
            ) from None
        self.source = source

    def render(self, item: Mapping[str, Any], fields: Mapping[str, Any], item_id: str) -> str:
        """The prompt for one item: the names are the item's input fields and the fields earlier steps
        set (those win on a clash, being newer).

        :raises PromptTemplateError: a name the item does not have, or any other rendering error.
        """
        values = {**item, **fields} if fields else dict(item)
        missing = sorted(self.names.difference(values))
        if missing:
            raise PromptTemplateError(
                f"item {item_id!r}: the {self.what} names {_fields(missing)} the item does not have (it has "
                f"{sorted(values)}); add the field to the items, or change the {self.what}"
            )
        try:
            return self._template.render(values)
        except jinja2.TemplateError as exc:  # e.g. {{ meta.lang }} where meta has no 'lang'
            raise PromptTemplateError(
                f"item {item_id!r}: the {self.what} could not be rendered: {type(exc).__name__}: {exc}"
            ) from None


def _fields(names: list[str]) -> str:
    return f"field {names[0]!r}" if len(names) == 1 else f"fields {names}"
