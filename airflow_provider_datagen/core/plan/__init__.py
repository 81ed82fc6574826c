"""The plan: the rule that classifies source items against the log, and one assembler of its result.

:mod:`.rules` holds the rule (how an item matches the state table, and the class that makes it);
:mod:`.assemble` turns a classification into a :class:`~.rules.ResumePlan` and the status counts.
The inline plan (:mod:`~airflow_provider_datagen.core.planner`), the in-memory plan of a path source
(:mod:`~airflow_provider_datagen.core.chunks`) and the partitioned plan
(:mod:`~airflow_provider_datagen.core.partitioned_plan`) all use them.
"""

from __future__ import annotations
