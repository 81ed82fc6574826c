"""The completed items as a Hugging Face ``datasets.Dataset``, in memory: no file is written.

The dataset holds the export's columns (see :mod:`~airflow_provider_datagen.core.export`), so its
features are those ``datasets.load_dataset("parquet", ...)`` gives for a Parquet export of the same
log: ``Value("string")``, ``Value("int64")``, ``List(...)``, a dict of features for a struct, and
``Value("large_binary")`` for a ``bytes`` field. ``datasets`` is the optional extra ``[hf]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.export import export_table, exported_states, items_inputs
from airflow_provider_datagen.exceptions import ConfigurationError, bad_argument

if TYPE_CHECKING:
    import datasets

    from airflow_provider_datagen.core.store.log import CheckpointLog


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigurationError(
            "to_hf_dataset needs the Hugging Face datasets library; install airflow-provider-datagen[hf] "
            "(or pip install datasets)"
        ) from None
    return datasets


def to_hf_dataset(
    log: CheckpointLog,
    *,
    include_input: bool = False,
    source: Any = None,
    key_field: str = "id",
    include_removed: bool = False,
    include_blobs: bool = True,
) -> datasets.Dataset:
    """The completed items of ``log`` as a ``datasets.Dataset``: the export's rows and columns, in id order.

    Takes :func:`~airflow_provider_datagen.core.export.export_results`'s selection arguments (which
    items, their inputs, bytes or digests); nothing is written. ``dataset.push_to_hub(repo_id)``
    publishes it.

    :param include_input: add each item's source input as a struct column ``input``; needs ``source``.
    :param source: the source to select items by (and read inputs from), instead of the recorded one.
    :param key_field: the key field of ``source``.
    :param include_removed: also the completed items the source no longer holds.
    :param include_blobs: ``bytes`` fields as binary columns of their bytes; False: their digest structs.
    :raises ExperimentNotFoundError: the experiment has no log.
    :raises ConfigurationError: ``datasets`` is not installed, or ``include_input`` without ``source``.
    """
    hf = _datasets()
    if include_input and source is None:
        raise bad_argument(
            "to_hf_dataset",
            "include_input",
            include_input,
            "needs the items' inputs, and the log keeps only their fingerprints",
            "pass source= and key_field= as given to the plan, or include_input=False",
        )
    states, _ = exported_states(log, source, key_field, include_removed)
    inputs = items_inputs(source, key_field, states, log) if include_input else None
    table, _, _ = export_table(states, inputs, include_blobs=include_blobs, fmt="parquet")
    return hf.Dataset(table.replace_schema_metadata(None))
