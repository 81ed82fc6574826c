"""DatagenExportOperator: write the completed items to a results dataset declared as an Asset."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset

from airflow_provider_datagen._arguments import (
    bad_argument,
    check_absolute_path,
    check_non_empty_str,
    is_template,
)
from airflow_provider_datagen.core.export_spec import FORMATS
from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.operators import lineage
from airflow_provider_datagen.operators.base import DatagenBaseOperator, folded_status

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_datagen.experiment import DatagenExperiment


class DatagenExportOperator(DatagenBaseOperator):
    """
    Export the folded fields of completed items to a Lance dataset (or Parquet or JSON Lines files) and
    fingerprint it.

    Columns: ``item_id``, ``key``, one typed column per field (Arrow types inferred from the values;
    a field whose values do not share one type is a column of JSON text, named in the task log and
    in ``json_fields``), and with ``include_input=True`` the item's input as a struct column
    ``input``. A field named ``item_id``, ``key`` or ``input``, or holding a ``.``, gets the column
    ``field_<name>`` (dots as ``_``), listed in ``renamed_fields``.

    The destination is declared as an Airflow Asset (outlet), so downstream DAGs can be scheduled on
    fresh results. An unchanged export (the destination already holds the same content) writes no
    new version and emits no asset event. Only the items of the experiment's current source are
    exported (the source the last plan recorded, or ``source``): completed items whose rows were
    deleted from it are left out and counted in ``removed``. Returns ``{"rows", "fingerprint",
    "changed", "json_fields", "renamed_fields", "removed", "format", "base64_fields"}``; equal results
    give equal fingerprints whatever history (failures, crashes, reruns) produced them. Fails with
    :class:`~airflow_provider_datagen.exceptions.ExperimentNotFoundError` when the experiment has no
    log (a misspelt name), writing nothing.

    :param pipeline: pipeline name. Not needed when ``experiment`` is a ``DatagenExperiment``.
    :param experiment: experiment name. Or a
        :class:`~airflow_provider_datagen.experiment.DatagenExperiment`: then ``pipeline``,
        ``datagen_conn_id`` (and ``processor_version``) come from it, and an explicit different one is an error.
    :param destination: absolute path or URI of the export dataset (overwritten when it changes).
    :param include_input: add each item's source input as a struct column ``input``; needs ``source``.
    :param source: the source whose items to export, instead of the one the last plan recorded (its
        ids are read); with ``include_input=True``, needed: the log keeps input fingerprints, not inputs.
    :param key_field: the key field of ``source``.
    :param include_removed: export every completed item, also those the source no longer holds.
    :param format: ``"lance"`` (a Lance dataset), ``"parquet"`` or ``"jsonl"`` (part files and a manifest
        under the destination folder); the columns and the fingerprint are the same in each.
    :param include_blobs: export ``bytes`` fields as binary columns of their bytes (base64 text in JSONL,
        named in ``base64_fields``); False exports each as ``{"$bytes_sha256", "size"}``.
    :param datagen_conn_id: connection of type ``datagen``; its storage options apply to the
        destination too.
    """

    template_fields = ("pipeline", "experiment", "destination", "source")

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        destination: str,
        include_input: bool = False,
        source: Any = None,
        key_field: str = "id",
        include_removed: bool = False,
        format: str = "lance",
        include_blobs: bool = True,
        datagen_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(destination, (str, os.PathLike)) or not os.fspath(destination):
            raise bad_argument(
                self, "destination", destination, "is not a path or URI string", "give an absolute path or a URI"
            )
        destination = os.fspath(destination)
        check_absolute_path(self, "destination", destination)
        if not is_template(destination):
            kwargs.setdefault("outlets", [Asset(asset_uri(destination))])
        if not isinstance(include_input, bool):
            raise bad_argument(self, "include_input", include_input, "is not a bool", "pass True or False")
        if not isinstance(include_removed, bool):
            raise bad_argument(
                self,
                "include_removed",
                include_removed,
                "is not a bool",
                "pass True to export completed items the source no longer holds too, False for the source's only",
            )
        if format not in FORMATS:
            raise bad_argument(
                self, "format", format, "is not an export format", f"pass one of {', '.join(map(repr, FORMATS))}"
            )
        if not isinstance(include_blobs, bool):
            raise bad_argument(self, "include_blobs", include_blobs, "is not a bool", "pass True or False")
        if include_input and source is None:
            raise bad_argument(
                self,
                "include_input",
                include_input,
                "needs the items' inputs, and the log keeps only their fingerprints",
                "pass source= and key_field= as given to DatagenPlanOperator, or include_input=False",
            )
        if source is not None and not isinstance(source, (list, tuple, str, os.PathLike)):
            raise bad_argument(
                self,
                "source",
                source,
                f"is a {type(source).__name__}, not a list of dicts or a path/URI string",
                "give the plan's source: the items inline or a .jsonl, .parquet or .lance path or URI",
            )
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        self.destination = destination
        self.include_input = include_input
        self.include_removed = include_removed
        self.format = format
        self.include_blobs = include_blobs
        self.source = list(source) if isinstance(source, tuple) else source
        self.key_field = check_non_empty_str(self, "key_field", key_field, "name the field holding each item's key")

    def execute(self, context: Context) -> dict[str, Any]:
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core import export_results

        event_log = self.get_log()
        result = export_results(
            event_log,
            self.destination,
            storage_options=self.hook.storage_options or None,
            include_input=self.include_input,
            source=self.source,
            key_field=self.key_field,
            include_removed=self.include_removed,
            format=self.format,
            include_blobs=self.include_blobs,
        )
        self.record_lineage(event_log.uri, result)
        if result["removed"]:
            self.log.info(
                "%d completed items are not in the current source (their rows were deleted) and were not exported; "
                "pass include_removed=True to export them too",
                result["removed"],
            )
        if result["json_fields"]:
            self.log.info(
                "columns holding JSON text (their values do not share one Arrow type): %s",
                ", ".join(result["json_fields"]),
            )
        if result["renamed_fields"]:
            self.log.info("fields exported under another column name: %s", result["renamed_fields"])
        if result["changed"]:
            self.log.info(
                "exported %d rows to %s, fingerprint %s", result["rows"], self.destination, result["fingerprint"]
            )
        else:
            # The task runner builds the success message's asset events from this task's outlets as they
            # are when execute returns (task_runner._handle_current_task_success): without the destination's
            # asset this run announces nothing about it (the DAG still declares it; other outlets stay).
            unchanged = Asset(asset_uri(self.destination)).uri
            self.outlets = [o for o in self.outlets if not (isinstance(o, Asset) and o.uri == unchanged)]
            self.log.info(
                "export unchanged: %s already holds these %d rows (fingerprint %s); no new version, no asset event",
                self.destination,
                result["rows"],
                result["fingerprint"],
            )
        self.push_status(context, folded_status(event_log))
        return result

    def record_lineage(self, log_uri: str, result: dict[str, Any]) -> None:
        """Keep what this export read and wrote for its OpenLineage event; the columns only when it is enabled."""
        columns = None
        if lineage.enabled():
            columns = lineage.exported_columns(self.destination, self.hook.storage_options or None, self.format)
        lineage.record(self, inputs=[log_uri], outputs=[self.destination], columns=columns, rows=result["rows"])

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (its provider installed): the log as an input, the destination (columns, rows) as output."""
        return lineage.operator_lineage(self)


def asset_uri(destination: str) -> str:
    """The Asset URI of an export destination (``file://`` for local paths)."""
    if has_scheme(destination):
        return destination
    return "file://" + os.path.abspath(destination)
