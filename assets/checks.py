"""Asset checks on what downstream relies on, evaluated by the asset that wrote the rows.

Each check is a blocking ``AssetCheckSpec`` on its asset, and the asset returns its result with
the materialization: a failure still stops everything downstream, but a run pays no extra
Dagster step per check, and the checks look only at what the run wrote.
"""

import dagster as dg
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, Schema

from claw_pipelines.derived_schemas import LEGACY_COLUMNS
from claw_pipelines.lake.filters import keyed


def schema_spec(asset: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        "schema_unchanged",
        asset=asset,
        blocking=True,
        description="The Delta table's columns and types equal the declared derived schema.",
    )


STEP_CHECKS = [
    dg.AssetCheckSpec(
        "unique_step_ids",
        asset="steps",
        blocking=True,
        description="step_id is unique across the table.",
    ),
    dg.AssetCheckSpec(
        "logprobs_aligned",
        asset="steps",
        blocking=True,
        description="Each new step with logprobs has exactly one logprob per response token.",
    ),
]
"""The steps' own checks; ``assets.incremental`` adds ``schema_unchanged`` to every table's."""


def schema_unchanged(table: DeltaTable | None, declared: pa.Schema) -> dg.AssetCheckResult:
    """The table still has the schema declared in claw_pipelines.derived_schemas (plus any
    ``LEGACY_COLUMNS`` an earlier version wrote, which nothing reads)."""
    if table is None:
        return dg.AssetCheckResult(
            check_name="schema_unchanged", passed=True, metadata={"table": "not created yet"}
        )
    actual = {f.name: str(f.type) for f in table.schema().fields}
    expected = {f.name: str(f.type) for f in Schema.from_arrow(declared).fields}
    legacy = LEGACY_COLUMNS - expected.keys()
    changed = sorted(
        name
        for name in actual.keys() | expected.keys()
        if actual.get(name) != expected.get(name) and name not in legacy
    )
    return dg.AssetCheckResult(
        check_name="schema_unchanged",
        passed=not changed,
        metadata={"changed_columns": dg.MetadataValue.json(changed)},
    )


def repeated_ids(table: pl.LazyFrame | None, column: str, ids: pl.Series) -> pl.Series:
    """Which of ``ids`` occur more than once in ``column`` of ``table``.

    Checking only a run's new ids is enough (older ids were checked when they were new), so
    the check grows with the run, not the table (``lake.keyed`` skips the rest by statistics).
    """
    if table is None:
        return pl.Series(column, [], pl.String)
    return (
        keyed(table.select(column), column, ids)
        .group_by(column)
        .len()
        .filter(pl.col("len") > 1)
        .sort(column)
        .collect()
        .get_column(column)
    )


def unique_step_ids(steps: pl.LazyFrame | None, new_ids: pl.Series) -> dg.AssetCheckResult:
    """The run's new step ids occur once in the steps table."""
    duplicated = repeated_ids(steps, "step_id", new_ids)
    return dg.AssetCheckResult(
        check_name="unique_step_ids",
        passed=duplicated.is_empty(),
        metadata={
            "checked": new_ids.len(),
            "duplicated_step_ids": dg.MetadataValue.json(duplicated.head(20).to_list()),
        },
    )


def logprobs_aligned(new_steps: pl.DataFrame) -> dg.AssetCheckResult:
    """``new_steps``: the run's steps with a ``logprobs_misaligned`` flag per step."""
    misaligned = new_steps.filter(pl.col("logprobs_misaligned")).get_column("step_id")
    return dg.AssetCheckResult(
        check_name="logprobs_aligned",
        passed=misaligned.is_empty(),
        metadata={
            "checked": new_steps.height,
            "misaligned_step_ids": dg.MetadataValue.json(misaligned.head(20).to_list()),
        },
    )
