"""The factory of the incremental assets: a derived table named once with its sources and schema.

An incremental asset reads what landed in its sources since its watermark
(``claw_pipelines.incremental.increment.Increment``) and writes one derived table. The sources
given here are both the asset's ``deps`` (its lineage in the UI, what automation waits for) and
the inputs its ``Increment`` pins, so the two cannot drift apart; the schema is both the columns
the UI shows before a first run and what the ``schema_unchanged`` check compares the table with.
"""

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import pyarrow as pa
from deltalake import DeltaTable

from assets.automation import on_new_data
from assets.checks import schema_spec, schema_unchanged
from assets.landing import OWNERS
from assets.metadata import declared_columns, written_metadata
from assets.races import retried_when_raced
from claw_pipelines.incremental.increment import Increment
from resources.lake import LakeResource


@dataclass
class Refreshed:
    """What an incremental asset's body wrote; the factory maps it to Dagster's result."""

    table: DeltaTable | None
    """The output table after the run's last commit (None: no commit yet)."""
    rows_written: int
    metadata: dict[str, Any] = field(default_factory=dict)
    """The asset's own facts (samples, distributions), next to what the run read and wrote."""
    checks: list[dg.AssetCheckResult] = field(default_factory=list)
    """The results of the asset's own checks; ``schema_unchanged`` is added to them."""


def pool(table: str) -> str:
    """One pool per derived table: dagster.yaml gives each one slot, so one writer at a time."""
    return f"claw_{table}"


def incremental_asset(
    table: str,
    *,
    sources: Sequence[str],
    schema: pa.Schema,
    group: str,
    checks: Sequence[dg.AssetCheckSpec] = (),
    automation_condition: dg.AutomationCondition | None = None,
    op_tags: Mapping[str, str] | None = None,
) -> Callable[[Callable[..., Refreshed]], dg.AssetsDefinition]:
    """The asset writing ``table`` from ``sources``, around the decorated body.

    The body takes the run's ``increment`` (opened over ``sources``) where an asset takes its
    lake, plus what Dagster gives any asset (``context``, a ``config``), and returns
    ``Refreshed``. The asset runs in its table's pool, is retried when it lost a commit race,
    and refreshes ``on_new_data`` unless ``automation_condition`` says otherwise; its
    description is the body's docstring.
    """
    inputs = list(sources)
    condition = on_new_data() if automation_condition is None else automation_condition

    def asset(body: Callable[..., Refreshed]) -> dg.AssetsDefinition:
        @functools.wraps(body)
        def materialize(
            context: dg.AssetExecutionContext, lake: LakeResource, **given: Any
        ) -> dg.MaterializeResult:
            increment = Increment.begin(lake.lake(), table, table, inputs)
            refreshed = body(context, increment=increment, **given)
            written = (
                {}
                if refreshed.table is None
                else written_metadata(increment, refreshed.table, refreshed.rows_written)
            )
            return dg.MaterializeResult(
                metadata={**written, **refreshed.metadata},
                check_results=[schema_unchanged(refreshed.table, schema), *refreshed.checks],
            )

        materialize.__signature__ = _with_lake(body)
        return dg.asset(
            name=table,
            group_name=group,
            kinds={"deltalake", "polars"},
            owners=OWNERS,
            deps=inputs,
            automation_condition=condition,
            pool=pool(table),
            op_tags=op_tags,
            check_specs=[schema_spec(table), *checks],
            metadata=declared_columns(schema),
        )(retried_when_raced(materialize))

    return asset


def _with_lake(body: Callable[..., Refreshed]) -> inspect.Signature:
    """``body``'s signature with the lake resource in place of ``increment``: what Dagster reads
    to know which resources and config the asset takes."""
    params = inspect.signature(body, eval_str=True).parameters.values()
    return inspect.Signature(
        [
            p.replace(name="lake", annotation=LakeResource) if p.name == "increment" else p
            for p in params
        ],
        return_annotation=dg.MaterializeResult,
    )
