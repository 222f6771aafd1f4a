"""Building one batch: its plan (reserved now, or re-planned from its pins under the recipe it
was planned with) and its rows in ``batches/<recipe>``. ``batching.release`` checks and
exports what this writes."""

from __future__ import annotations

from typing import NamedTuple

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from claw_pipelines.batches.names import batches_table, ledger_table, retired_table
from claw_pipelines.batches.pins import Pins
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching import ledger
from claw_pipelines.batching.planner import BatchPlan
from claw_pipelines.derived_schemas import DPO_PAIRS, STORED_BATCH_ROWS, WRITER, conform
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import COMPACT_AFTER_FILES, commit
from claw_pipelines.lake.filters import sql_in
from claw_pipelines.schemas import utc_now


def batch_schema(recipe: Recipe) -> pa.Schema:
    """What ``batches/<recipe>`` stores: dpo pairs complete, other rows pointing at turns."""
    return DPO_PAIRS if recipe.algorithm == "dpo" else STORED_BATCH_ROWS


class Planned(NamedTuple):
    """A batch's plan and what it was planned with."""

    plan: BatchPlan
    recipe: Recipe
    """The recipe as it was when the batch was reserved (``ledger.pinned_recipe``)."""
    pins: Pins
    reserved_now: bool
    """Reserved by this call, not re-planned from an earlier reservation."""


def planned(lake: Lake, recipe: Recipe, batch_id: str) -> Planned | None:
    """The plan of ``batch_id`` (None: it was never reserved, and not enough is ready for it);
    a batch reserved before is re-planned from its pins under the recipe it was planned with."""
    snapshot = lake.open(ledger_table(recipe.name))
    pins = ledger.recorded_pins(snapshot, batch_id)
    if pins is None:
        reserved = ledger.reserve_on(lake, recipe, [batch_id], utc_now(), snapshot)
        return just_reserved(recipe, reserved[0]) if reserved else None
    planned_under = ledger.pinned_recipe(recipe, pins)
    plan = ledger.plan_from_pins(lake, planned_under, batch_id, pins)
    return Planned(plan, planned_under, pins, False)


def just_reserved(recipe: Recipe, reservation: ledger.Reservation) -> Planned:
    """A batch this call reserved, as ``planned`` gives it."""
    return Planned(reservation.plan, recipe, reservation.pins, True)


def write_batch(lake: Lake, recipe: Recipe, plan: BatchPlan) -> tuple[DeltaTable, pa.Table]:
    """Replace the batch's rows in one commit, so a re-run never duplicates them; the table as
    written and the rows written. Rows point at their turns (no token lists:
    ``derived_schemas.STORED_BATCH_ROWS``), so even a batch of every step is a small write. A
    batch is one file, so the table is compacted as batches pile up. The schema is merged: a
    table from before a batch column gains it, null in older batches' rows."""
    schema = batch_schema(recipe)
    table = lake.ensure(batches_table(recipe.name), schema)
    rows = conform(plan.planned, schema)
    commit(  # refused, e.g., when another batch's compaction merged the files read
        table,
        rows,
        mode="overwrite",
        predicate=sql_in("batch_id", [plan.batch_id]),
        schema_mode="merge",
        writer_properties=WRITER,
        compact_after=COMPACT_AFTER_FILES,
        refused=f"another batch of {recipe.name} changed {batches_table(recipe.name)} "
        f"while {plan.batch_id} was written",
    )
    return table, rows


def retired_before(lake: Lake, recipe: str, pins: Pins) -> int:
    """How many steps earlier plans retired (the plan left them out), from the file statistics
    of the pinned version: no data read, however many there are."""
    if pins.batch_retired < 0:
        return 0
    retired = lake.open(retired_table(recipe), pins.batch_retired)
    files = pl.DataFrame(retired.get_add_actions(flatten=True))
    return int(files.get_column("num_records").sum()) if files.height else 0
