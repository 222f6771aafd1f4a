"""A recipe's batch as one call each for the Dagster layer: ``build_batch`` (plan or re-plan,
write ``batches/<recipe>``, check), ``export_batch`` (check again unless just built, write the
export files and manifest) and ``release_ready`` (reserve every ready batch from one plan,
then build and export each in turn). Each returns plain results that the assets record; a batch
breaking an invariant raises ``BatchRefused``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import polars as pl
from pydantic import BaseModel

from claw_pipelines.batches.manifest import Manifest
from claw_pipelines.batches.names import batches_table, export_folder, ledger_table
from claw_pipelines.batches.pins import Pins
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batches.rows import completed_chunks, in_export_order, stored_rows
from claw_pipelines.batching import ledger
from claw_pipelines.batching.building import (
    Planned,
    just_reserved,
    planned,
    retired_before,
    write_batch,
)
from claw_pipelines.batching.checks import CheckOutcome, groups_complete, no_step_consumed_twice
from claw_pipelines.batching.planner import BatchPlan
from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.exporters import Destination, export_chunks
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import ConcurrentRun
from claw_pipelines.schemas import utc_now

SAMPLE_ROWS = 8
SAMPLE_COLUMNS = ["group_id", "trajectory_id", "step_index", "reward", "chosen_reward"]

MAX_BATCHES_PER_RELEASE = 8
"""Batches of one recipe a release reserves and builds; the next release goes on with the
rest."""


class BatchRefused(RuntimeError):
    """A batch breaks an invariant (its re-plan differs from its reservation, it has no rows, it
    fails a check): running it again changes nothing, a person has to look."""


class BuiltBatch(BaseModel):
    """A batch written to ``batches/<recipe>``, with its check outcomes."""

    recipe: str
    batch_id: str
    planned_under: Recipe
    """The recipe as it was when the batch was reserved (``ledger.pinned_recipe``)."""
    recipe_edited: bool
    """The recipe was edited since the reservation: the batch kept the one it was planned with."""
    pins: Pins
    rows: int
    groups: int
    trajectories: int
    rewards: list[float | None]
    """Each row's reward (dpo: the chosen reply's)."""
    sample: list[dict[str, Any]]
    """The first rows' ids, rewards and reply text."""
    dropped: dict[str, int]
    """Steps in play left out of this batch, by reason."""
    retired: dict[str, int]
    """Steps this plan retired for good, by reason."""
    retired_before: int
    """Steps earlier plans retired (left out without being read)."""
    table_rows: int
    table_version: int
    table_uri: str
    checks: list[CheckOutcome]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)


class ExportedBatch(BaseModel):
    """A batch's export: its folder and the manifest written there last."""

    batch_id: str
    uri: str
    manifest: Manifest


class RaceLost(BaseModel):
    """A planner or a UI launch reserved first: the release stops, the next one goes on."""

    message: str


def _counts(frame: pl.DataFrame, column: str) -> dict[str, int]:
    return {str(k): n for k, n in frame.group_by(column).len().sort(column).iter_rows()}


def _sample(plan: BatchPlan, algorithm: str) -> list[dict[str, Any]]:
    """The plan's first rows with their reply's text: dpo pairs carry the chosen message, step
    rows read theirs from the plan's ``turns`` (batches point at their turns)."""
    rows = plan.planned.head(SAMPLE_ROWS)
    if algorithm == "dpo":
        message = pl.col("chosen_message")
    else:
        rows = with_turn_columns(rows, plan.turns, ["response_message"])
        message = pl.col("response_message")
    text = message.str.json_path_match("$.content").alias("response_text")
    return rows.select(*(c for c in SAMPLE_COLUMNS if c in rows.columns), text).to_dicts()


def _checks(
    lake: Lake, recipe: Recipe, rows: pl.DataFrame, consumed: pl.DataFrame
) -> list[CheckOutcome]:
    ledger_rows = lake.scan(ledger_table(recipe.name))
    return [groups_complete(recipe, rows), no_step_consumed_twice(ledger_rows, consumed)]


def build_batch(lake: Lake, recipe: Recipe, batch_id: str) -> BuiltBatch | None:
    """Plan, write and check ``batch_id`` (None: never reserved, and not enough ready data
    for it). A batch re-planned from its pins must reproduce the steps its reservation
    consumed."""
    built = _built(lake, recipe, batch_id)
    return None if built is None else built.batch


class _Built(NamedTuple):
    batch: BuiltBatch
    rows: pl.DataFrame
    """Its rows as ``batches/<recipe>`` stores them, in export order."""


def _built(lake: Lake, recipe: Recipe, batch_id: str) -> _Built | None:
    """``build_batch``, with the rows it wrote."""
    found = planned(lake, recipe, batch_id)
    return None if found is None else _written(lake, recipe, found)


def _written(lake: Lake, recipe: Recipe, found: Planned) -> _Built:
    """Write and check a planned batch; the rows it wrote, so a release exports them without
    reading them back."""
    plan, planned_under, pins, reserved_now = found
    batch_id = plan.batch_id
    consumed = plan.consumed.get_column("turn_id").sort()
    if not reserved_now:
        recorded = ledger.consumed_turns(lake, recipe.name, batch_id)
        if consumed.to_list() != recorded:
            raise BatchRefused(f"re-planning {batch_id} from its pins did not reproduce its ledger")
    rows = plan.planned
    table, written = write_batch(lake, planned_under, plan)
    files = pl.DataFrame(table.get_add_actions(flatten=True))
    reward = "chosen_reward" if recipe.algorithm == "dpo" else "reward"
    batch = BuiltBatch(
        recipe=recipe.name,
        batch_id=batch_id,
        planned_under=planned_under,
        recipe_edited=planned_under != recipe,
        pins=pins,
        rows=rows.height,
        groups=rows.get_column("group_id").n_unique(),
        trajectories=rows.get_column("trajectory_id").n_unique(),
        rewards=rows.get_column(reward).to_list(),
        sample=_sample(plan, recipe.algorithm),
        dropped=_counts(plan.dropped, "reason"),
        retired=_counts(plan.final, "reason"),
        retired_before=retired_before(lake, recipe.name, pins),
        table_rows=int(files.get_column("num_records").sum()) if files.height else 0,
        table_version=table.version(),
        table_uri=lake.uri(batches_table(recipe.name)),
        checks=_checks(lake, planned_under, rows, plan.consumed),
    )
    return _Built(batch, in_export_order(recipe.algorithm, pl.from_arrow(written)))


class Rechecked(NamedTuple):
    """A written batch checked again, as an export launched alone finds it."""

    planned_under: Recipe
    """The recipe as it was when the batch was reserved (``ledger.pinned_recipe``)."""
    pins: Pins | None
    failed: list[str]
    """The names of the checks it fails now."""


def _rechecked(lake: Lake, recipe: Recipe, batch_id: str, rows: pl.DataFrame) -> Rechecked:
    """The batch's pinned recipe and pins, and the checks its stored ``rows`` fail now (an
    export launched alone is not gated by its batch's run)."""
    pins = ledger.pins_of(lake, recipe.name, batch_id)
    planned_under = ledger.pinned_recipe(recipe, pins)
    consumed = ledger.consumed_steps(lake, recipe.name, batch_id)
    outcomes = _checks(lake, planned_under, rows, consumed)
    return Rechecked(planned_under, pins, [c.name for c in outcomes if not c.passed])


def failed_checks(lake: Lake, recipe: Recipe, batch_id: str) -> list[str]:
    """The checks the written ``batch_id`` fails now, which its export would refuse it for
    (none for a batch not written)."""
    rows = stored_rows(lake, recipe.name, recipe.algorithm, batch_id)
    return [] if rows.is_empty() else _rechecked(lake, recipe, batch_id, rows).failed


def export_batch(lake: Lake, recipe: Recipe, batch_id: str) -> ExportedBatch:
    """Export the written ``batch_id`` under the recipe it was planned with (today's export
    formats), once its checks pass again."""
    rows = stored_rows(lake, recipe.name, recipe.algorithm, batch_id)
    if rows.is_empty():
        raise BatchRefused(f"batch {batch_id} has no rows in {batches_table(recipe.name)}")
    rechecked = _rechecked(lake, recipe, batch_id, rows)
    if rechecked.failed:
        raise BatchRefused(f"batch {batch_id} fails {', '.join(rechecked.failed)}: not exported")
    return _exported(lake, rechecked.planned_under, rechecked.pins, rows)


def _exported(
    lake: Lake, planned_under: Recipe, pins: Pins | None, rows: pl.DataFrame
) -> ExportedBatch:
    """Write the export of one batch's stored ``rows`` (in export order) and its manifest."""
    batch_id = rows.get_column("batch_id")[0]
    out = Destination(lake.uri(export_folder(planned_under.name, batch_id)), lake.storage_options)
    manifest = export_chunks(
        planned_under,
        completed_chunks(lake, planned_under.algorithm, rows, planned_under.layout or "step"),
        out,
        source_versions=json.loads(rows["source_versions"][0]),
        planned_with=pins,
    )
    return ExportedBatch(batch_id=batch_id, uri=out.root, manifest=manifest)


def release_ready(
    lake: Lake, recipe: Recipe, limit: int = MAX_BATCHES_PER_RELEASE
) -> Iterator[BuiltBatch | ExportedBatch | RaceLost]:
    """Reserve ``recipe``'s ready batches, ``limit`` at most, from one plan and in one ledger
    commit, then build and export each, yielding each batch as built and then as exported (a
    batch failing its checks is not exported), so the caller records each as it lands. Yields
    only ``RaceLost`` when another run reserved first."""
    snapshot = lake.open(ledger_table(recipe.name))
    batch_ids = ledger.next_batch_ids(snapshot, recipe.name, limit)
    try:
        reserved = ledger.reserve_on(lake, recipe, batch_ids, utc_now(), snapshot)
    except ConcurrentRun as race:
        yield RaceLost(message=str(race))
        return
    for reservation in reserved:
        built = _written(lake, recipe, just_reserved(recipe, reservation))
        batch = built.batch
        yield batch
        if batch.passed:  # just checked: exported from the rows written, not read back
            yield _exported(lake, batch.planned_under, batch.pins, built.rows)
