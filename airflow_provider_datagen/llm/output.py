"""What a model step asks the model for (``output_type``) and how the answer becomes the item's fields.

- a pydantic model class: the model's fields are the item's fields (``model_dump(mode="json")``);
- a JSON schema (a dict with ``"type": "object"`` and ``"properties"``): its properties are the fields;
  the model is shown the schema (pydantic-ai's ``StructuredDict``) and its answer is validated against
  it with ``jsonschema`` (an invalid answer is sent back to the model, within the agent's output
  retries, like a pydantic model's);
- a dataclass or TypedDict: its fields, the same way;
- ``str`` (the default) or any other type: one field, ``output_field``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jsonschema
import typing_extensions
from pydantic import BaseModel, TypeAdapter

from airflow_provider_datagen.exceptions import bad_argument


class OutputSpec:
    """The ``output_type`` of a model step, checked, with the conversion of an answer to fields.

    :param output_type: a pydantic model class, a JSON schema dict, a dataclass, a TypedDict, ``str``
        or another type pydantic can validate.
    :param output_field: the field an answer of a non-structured type is stored in.
    """

    def __init__(self, output_type: Any, output_field: str, owner: object = "llm_process") -> None:
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core.ids import check_field_name
        from airflow_provider_datagen.exceptions import ConfigurationError

        try:
            check_field_name(output_field, error=ConfigurationError)
        except ConfigurationError as exc:
            raise bad_argument(owner, "output_field", output_field, "is not a usable field name", str(exc)) from None
        self.output_field = output_field
        self.schema: dict[str, Any] | None = None
        self._validator: Any = None
        if isinstance(output_type, Mapping):
            self.schema = _checked_schema(owner, output_type)
            self._validator = jsonschema.validators.validator_for(self.schema)(self.schema)
            self.kind = "schema"
        elif isinstance(output_type, type) and issubclass(output_type, BaseModel):
            self.kind = "model"
        elif isinstance(output_type, type) and (
            # typing_extensions' check knows both TypedDicts (pydantic takes only its on Python < 3.12)
            dataclasses.is_dataclass(output_type) or typing_extensions.is_typeddict(output_type)
        ):
            self.kind = "structured"
        elif output_type is str:
            self.kind = "text"
        else:
            try:
                TypeAdapter(output_type)
            except Exception as exc:  # pydantic's errors for a type it cannot validate vary by type
                raise bad_argument(
                    owner,
                    "output_type",
                    output_type,
                    f"is not a type pydantic can validate ({type(exc).__name__})",
                    "give a pydantic model class, a JSON schema dict, str, or a type such as list[str]",
                ) from None
            self.kind = "value"
        self.output_type = output_type
        self._adapter: TypeAdapter[Any] | None = (
            TypeAdapter(output_type) if self.kind in ("structured", "value") else None
        )

    @property
    def adapter(self) -> TypeAdapter[Any]:
        """The pydantic ``TypeAdapter`` of a non-schema output type (built once)."""
        if self._adapter is None:
            self._adapter = TypeAdapter(self.output_type)
        return self._adapter

    @property
    def validator(self) -> Any:
        """The ``jsonschema`` validator of a JSON-schema output type (None for the other kinds)."""
        return self._validator

    def agent_output_type(self) -> Any:
        """The ``output_type`` handed to the pydantic-ai agent (imports pydantic-ai for a JSON schema)."""
        if self.schema is None:
            return self.output_type
        from pydantic_ai import StructuredDict

        return StructuredDict(
            self.schema, name=self.schema.get("title") or "output", description=self.schema.get("description")
        )

    def check_answer(self, output: Any) -> Any:
        """A pydantic-ai output validator for a JSON-schema answer: ``ModelRetry`` naming what is wrong."""
        errors = sorted(self._validator.iter_errors(output), key=lambda e: list(e.absolute_path))
        if errors:
            from pydantic_ai import ModelRetry

            raise ModelRetry(
                "The answer does not match the JSON schema: "
                + "; ".join(f"{'/'.join(map(str, e.absolute_path)) or 'answer'}: {e.message}" for e in errors[:10])
            )
        return output

    def fields_of(self, output: Any) -> dict[str, Any]:
        """The item fields of the model's validated answer."""
        if self.kind == "model":
            return dict(output.model_dump(mode="json"))
        if self.kind == "schema":
            return dict(output)
        if self.kind == "text":
            return {self.output_field: output}
        value = self.adapter.dump_python(output, mode="json")
        if self.kind == "structured":
            return dict(value)
        return {self.output_field: value}

    def describe(self) -> Any:
        """A JSON-able description of the output type, for the step's version digest."""
        if self.schema is not None:
            return {"json_schema": self.schema}
        if self.kind == "model":
            return {"model": self.output_type.model_json_schema()}
        if self.kind == "text":
            return {"text": self.output_field}
        assert self._adapter is not None
        try:
            schema: Any = self._adapter.json_schema()
        except Exception:  # a type pydantic validates but cannot describe in JSON schema (e.g. a callable)
            schema = repr(self.output_type)
        return {"schema": schema, "field": self.output_field}


def _checked_schema(owner: object, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON schema whose answer is an object of named properties: each becomes a field."""
    props = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(props, Mapping) or not props:
        raise bad_argument(
            owner,
            "output_type",
            dict(schema),
            "is not a JSON schema of an object with properties",
            'give {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}',
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise bad_argument(
            owner, "output_type", dict(schema), f"is not a valid JSON schema ({exc.message})", "fix the schema"
        ) from None
    return dict(schema)


def validated_fields(output: OutputSpec, answer: Any, where: str) -> dict[str, Any]:
    """The item fields of a model's raw answer (text, or the decoded JSON object of a structured one),
    validated against the output type; :class:`OutputValidationError` starts with ``where`` and names
    what is wrong (the message an online step sends back to the model)."""
    from airflow_provider_datagen.exceptions import OutputValidationError

    if output.kind == "text":
        if not isinstance(answer, str):
            raise OutputValidationError(f"{where}: the answer is not text: {str(answer)[:200]}")
        return output.fields_of(answer)
    from pydantic import ValidationError

    if not isinstance(answer, Mapping):
        raise OutputValidationError(
            f"{where}: the answer is not a JSON object: {str(answer)[:200]}; the model did not follow the output schema"
        )
    try:
        if output.kind == "schema":
            errors = sorted(output.validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
            if errors:
                raise OutputValidationError(
                    f"{where}: the answer does not match the JSON schema: "
                    + "; ".join(f"{'/'.join(map(str, e.absolute_path)) or 'answer'}: {e.message}" for e in errors[:10])
                )
            return output.fields_of(answer)
        adapter = output.adapter
        if output.kind == "value":
            if output.output_field not in answer:
                raise OutputValidationError(f"{where}: the answer has no {output.output_field!r}")
            value = adapter.validate_python(answer[output.output_field])
        else:
            value = adapter.validate_python(dict(answer))
    except ValidationError as exc:
        raise OutputValidationError(
            f"{where}: the answer does not validate against the output type: {exc.errors()[:5]}"
        ) from None
    return output.fields_of(value)
