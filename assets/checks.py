"""Asset checks on what downstream relies on; blocking, so a failure stops the chain."""

import dagster as dg
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, Schema

from assets.quality import curated_steps, scored_steps
from assets.rewards import rewarded_steps
from assets.steps import steps, trajectories
from claw_pipelines.derived_schemas import (
    CURATED_STEPS,
    REWARDED_STEPS,
    SCORED_STEPS,
    STEPS,
    TRAJECTORIES,
)
from resources.lake import LakeResource

HISTORY_LIMIT = 1000
"""Commits looked back for the latest run's chunks (a backlog of ~16M turns)."""


@dg.asset_check(asset=steps, blocking=True, description="step_id is unique across the table.")
def unique_step_ids(lake: LakeResource) -> dg.AssetCheckResult:
    ids = lake.lake().scan("steps")
    if ids is None:
        return dg.AssetCheckResult(passed=True, metadata={"steps": 0})
    stats = ids.select(
        pl.len().alias("steps"), pl.col("step_id").n_unique().alias("distinct")
    ).collect()
    total, distinct = stats.row(0)
    return dg.AssetCheckResult(
        passed=total == distinct, metadata={"steps": total, "duplicates": total - distinct}
    )


@dg.asset_check(
    asset=steps,
    blocking=True,
    description="Each new step with logprobs has exactly one logprob per response token.",
)
def logprobs_aligned(lake: LakeResource) -> dg.AssetCheckResult:
    """Checks the latest run's commits only: steps are append-only, so each row is checked once."""
    the_lake = lake.lake()
    table = the_lake.open("steps")
    version = None if table is None else table.version()
    latest = None
    if table is not None:
        first = _first_version_of_last_run(table)
        latest, _ = the_lake.read_changes(
            "steps",
            first - 1 if first > 0 else None,
            columns=["step_id", "response_token_ids", "response_logprobs"],
        )
    if latest is None:
        return dg.AssetCheckResult(passed=True, metadata={"checked": 0})
    misaligned = latest.filter(
        pl.col("response_logprobs").list.len() != pl.col("response_token_ids").list.len()
    ).get_column("step_id")
    return dg.AssetCheckResult(
        passed=misaligned.is_empty(),
        metadata={
            "checked": latest.height,
            "delta_version": version,
            "misaligned_step_ids": dg.MetadataValue.json(misaligned.head(20).to_list()),
        },
    )


def _first_version_of_last_run(table: DeltaTable) -> int:
    """The first of the consecutive commits that read the same input ranges as the latest one
    (a run that extracts a backlog commits it in chunks)."""
    history = table.history(HISTORY_LIMIT)
    first = history[0]["version"]
    for entry in history[1:]:
        if entry.get("claw.read") != history[0].get("claw.read"):
            break
        first = entry["version"]
    return first


def _delta_fields(schema: pa.Schema) -> dict[str, str]:
    return {f.name: str(f.type) for f in Schema.from_arrow(schema).fields}


def schema_check(asset: dg.AssetsDefinition, declared: pa.Schema) -> dg.AssetChecksDefinition:
    """The table still has the schema declared in claw_pipelines.derived_schemas."""
    table = asset.key.path[-1]

    @dg.asset_check(
        asset=asset,
        name="schema_unchanged",
        blocking=True,
        description="The Delta table's columns and types equal the declared derived schema.",
    )
    def _check(lake: LakeResource) -> dg.AssetCheckResult:
        delta_table = lake.lake().open(table)
        if delta_table is None:
            return dg.AssetCheckResult(passed=True, metadata={"table": "not created yet"})
        actual = {f.name: str(f.type) for f in delta_table.schema().fields}
        expected = _delta_fields(declared)
        changed = sorted(
            name
            for name in actual.keys() | expected.keys()
            if actual.get(name) != expected.get(name)
        )
        return dg.AssetCheckResult(
            passed=not changed, metadata={"changed_columns": dg.MetadataValue.json(changed)}
        )

    return _check


CHECKS = [
    unique_step_ids,
    logprobs_aligned,
    *(
        schema_check(asset, declared)
        for asset, declared in (
            (steps, STEPS),
            (trajectories, TRAJECTORIES),
            (rewarded_steps, REWARDED_STEPS),
            (scored_steps, SCORED_STEPS),
            (curated_steps, CURATED_STEPS),
        )
    ),
]
