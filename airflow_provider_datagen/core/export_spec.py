"""The export formats by name: light (no pyarrow), so an operator checks ``format=`` while a DAG is parsed."""

from __future__ import annotations

from typing import Final

#: The export formats, by the name ``export_results(format=...)`` takes; ``"lance"`` is the default.
FORMATS: Final = ("lance", "parquet", "jsonl")
#: The formats written as part files and a manifest under the destination folder.
FILE_FORMATS: Final = ("parquet", "jsonl")
