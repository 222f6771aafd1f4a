"""Batch reservations: which steps each batch of a recipe consumed, and what it was planned from.

``batch_ledger/<recipe>`` holds one row per consumed step, with its trajectory's first start
(``planner.started_since``: a plan reads only the rows of trajectories started since its
window, and the files are merged up to ``SETTLED_FILE_BYTES`` only, so statistics skip the
rest). A batch's rows are appended in one commit together with its pins (the curated_steps,
steps, turns, ledger and retirement versions it was planned from, the policy version announced
then and the planning time), so the ledger is both the "at most one batch per step" guarantee
and the partition's record: re-planning from the pins reproduces the batch exactly.
Reservations carry a ``claw/plan/<recipe>`` app transaction taken from the snapshot the plan was
made on, so two planners racing on the same ledger cannot both commit: the loser's step is
retried (``ConcurrentRun``) and plans again from the ledger the winner left.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from claw_pipelines.batches.names import batches_table, ledger_table, manifest_path, retired_table
from claw_pipelines.batches.pins import Pins
from claw_pipelines.batches.recipe import PINNED, Recipe
from claw_pipelines.batching.planner import BatchPlan, plan_batches
from claw_pipelines.batching.retirements import Retirements
from claw_pipelines.derived_schemas import LEDGER, conform, fit
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import COMPACT_AFTER_FILES, ConcurrentRun, commit
from claw_pipelines.lake.filters import floor_ms, keyed
from claw_pipelines.lake.properties import SETTLED_FILE_BYTES
from claw_pipelines.policy.versions import highest_announced_version, lag_reference

PINNED_LEDGER = LEDGER.append(pa.field("pins", pa.string()))
"""The ledger as written here: each row also carries its batch's pins (JSON)."""


SOURCE_PINS = {"curated_steps", "steps", "turns", "batch_ledger"}
"""The pins a batch's rows record as their ``source_versions``."""


def _plan_app(recipe: str) -> str:
    return f"claw/plan/{recipe}"


def next_batch_id(lake: Lake, recipe: str, version: int | None = None) -> str:
    """The next sequential id (``grpo-000001``) in the ledger's ``version`` (default the
    latest): ``next_batch_ids`` for one."""
    return next_batch_ids(lake.open(ledger_table(recipe), version), recipe, 1)[0]


def next_batch_ids(ledger: DeltaTable | None, recipe: str, count: int) -> list[str]:
    """The next ``count`` sequential ids (``grpo-000001``) after the reservations so far in
    ``ledger`` (a recipe's ledger as opened), skipping ids that a partition added in the UI
    under this pattern has already reserved. Counted by the planner's transaction version, so
    the ledger's rows are read only from that id on, whatever its age."""
    number = 1 if ledger is None else (ledger.transaction_version(_plan_app(recipe)) or 0) + 1
    taken: set[str] = set()
    if ledger is not None:
        later = pl.scan_delta(ledger).filter(pl.col("batch_id") >= f"{recipe}-{number:06d}")
        taken = set(later.select("batch_id").unique().collect().get_column("batch_id"))
    ids: list[str] = []
    while len(ids) < count:
        if f"{recipe}-{number:06d}" not in taken:
            ids.append(f"{recipe}-{number:06d}")
        number += 1
    return ids


class PinnedInputs(NamedTuple):
    """The tables a plan reads, open at the versions its pins name (``turns`` at it or
    later); None where the plan goes without (no ledger or no retirements yet)."""

    curated: DeltaTable
    turns: DeltaTable | None
    ledger: DeltaTable | None
    retired: DeltaTable | None


def plan_from_pins(lake: Lake, recipe: Recipe, batch_id: str, pins: Pins) -> BatchPlan:
    """The plan for ``batch_id`` from exactly the inputs it was (or is being) planned from.
    The rows' token lists are read from the latest ``turns``: turns are append-only and never
    rewritten, so a turn reads the same in every version from the pinned ``turns`` one on, and
    the landing table's vacuum (which makes old versions unreadable) cannot break a re-plan."""
    ledger_version, retired_version = pins.batch_ledger, pins.batch_retired
    inputs = PinnedInputs(
        lake.open("curated_steps", pins.curated_steps),
        lake.open("turns"),
        None if ledger_version < 0 else lake.open(ledger_table(recipe.name), ledger_version),
        None if retired_version < 0 else lake.open(retired_table(recipe.name), retired_version),
    )
    return plan_pinned(recipe, [batch_id], pins, inputs)[0]


def plan_pinned(
    recipe: Recipe, batch_ids: list[str], pins: Pins, inputs: PinnedInputs
) -> list[BatchPlan]:
    """``plan_from_pins`` with its inputs already open (a reservation has them open: on an
    object store each open costs a dozen requests or more), for the batches at positions
    ``pins.position``, ``pins.position + 1``, ... of the plan, one per id. The plan has read
    the curated steps, the ledger and the retirements when it returns (only ``BatchPlan.turns``
    stays a scan), so the caller may then commit through those tables."""
    return plan_batches(
        recipe,
        pl.scan_delta(inputs.curated),
        None if inputs.turns is None else pl.scan_delta(inputs.turns),
        None if inputs.ledger is None else pl.scan_delta(inputs.ledger),
        pins.planned_at,
        batch_ids=batch_ids,
        first=pins.position,
        retired=None if inputs.retired is None else pl.scan_delta(inputs.retired),
        open_since=pins.open_since,
        latest_policy_version=lag_reference(pins.announced_policy_version, inputs.curated),
        source_versions=pins.model_dump(include=SOURCE_PINS),
    )


def pinned_recipe(recipe: Recipe, pins: Pins | None) -> Recipe:
    """The recipe as it was when the batch was planned, with today's exports: re-planning under
    an edited recipe would silently change a batch that may have been trained on already.
    Batches reserved before recipes were pinned re-plan under ``recipe``."""
    if pins is None or pins.recipe is None:
        return recipe
    return Recipe.model_validate({**pins.recipe, "exports": recipe.exports}, context=PINNED)


def recorded_pins(ledger: DeltaTable | None, batch_id: str) -> Pins | None:
    """The pins ``ledger`` (a recipe's ledger as opened) records for ``batch_id`` (None if it
    was never reserved there)."""
    if ledger is None:
        return None
    found = (
        pl.scan_delta(ledger)
        .filter(pl.col("batch_id") == batch_id)
        .select("pins")
        .head(1)
        .collect()
    )
    return Pins.model_validate_json(found.item()) if found.height else None


def pins_of(lake: Lake, recipe: str, batch_id: str) -> Pins | None:
    """The pins recorded when ``batch_id`` was reserved (None if it never was)."""
    return recorded_pins(lake.open(ledger_table(recipe)), batch_id)


def exported_batches(lake: Lake, recipe: str, batch_ids: list[str]) -> set[str]:
    """Which of ``batch_ids`` finished their export (an export writes its manifest last): one
    existence check each, so the cost follows the batches asked about, not all exports."""
    manifests = [manifest_path(recipe, batch_id) for batch_id in batch_ids]
    return {b for b, found in zip(batch_ids, lake.files_exist(manifests), strict=True) if found}


def unfinished_batches(
    lake: Lake, recipe: str, reserved_before: datetime, reserved_since: datetime | None = None
) -> pl.DataFrame:
    """Batches reserved in ``[reserved_since, reserved_before)`` that have no rows in
    ``batches/<recipe>`` or no finished export, oldest first, with whether they are ``written``
    and when they were reserved: their steps are consumed, so only a run of their partition can
    still finish them. Reads two small columns of the ledger in that window, the batch ids of
    the files of ``batches/<recipe>`` those batches can be in (ids are ordered), and the
    manifests of the written ones."""
    columns = {"batch_id": pl.String, "written": pl.Boolean, "planned_at": pl.Datetime("us", "UTC")}
    reserved = lake.scan(ledger_table(recipe))
    if reserved is None:
        return pl.DataFrame(schema=columns)
    window = pl.col("planned_at") < reserved_before
    if reserved_since is not None:
        window &= pl.col("planned_at") >= floor_ms(reserved_since)
    candidates = (
        reserved.filter(window).group_by("batch_id").agg(pl.col("planned_at").min()).collect()
    )
    batches = lake.scan(batches_table(recipe))
    written = (
        pl.Series("batch_id", [], pl.String)
        if batches is None
        else keyed(batches.select("batch_id"), "batch_id", candidates["batch_id"])
        .unique()
        .collect()["batch_id"]
    )
    candidates = candidates.with_columns(written=pl.col("batch_id").is_in(written.implode()))
    exported = exported_batches(
        lake, recipe, candidates.filter("written").get_column("batch_id").to_list()
    )
    return (
        candidates.filter(~pl.col("written") | ~pl.col("batch_id").is_in(list(exported)))
        .sort("planned_at", "batch_id")
        .select(pl.col(name).cast(dtype) for name, dtype in columns.items())
    )


def consumed_steps(lake: Lake, recipe: str, batch_id: str) -> pl.DataFrame:
    """The turn ids ``batch_id`` consumed (sorted), with their trajectory's first start as its
    ledger rows keep it (null in rows kept before it)."""
    rows = lake.scan(ledger_table(recipe)).filter(pl.col("batch_id") == batch_id)
    return fit(rows, LEDGER).select("turn_id", "trajectory_started_at").collect().sort("turn_id")


def consumed_turns(lake: Lake, recipe: str, batch_id: str) -> list[str]:
    return consumed_steps(lake, recipe, batch_id).get_column("turn_id").to_list()


class Reservation(NamedTuple):
    """A batch just reserved: its plan and the pins recorded with it."""

    plan: BatchPlan
    pins: Pins


def reserve(lake: Lake, recipe: Recipe, batch_id: str, now: datetime) -> Reservation | None:
    """Plan the next batch from the latest curated steps and record it; None if not ready."""
    snapshot = lake.open(ledger_table(recipe.name))
    if recorded_pins(snapshot, batch_id) is not None:
        raise ConcurrentRun(f"{batch_id} was reserved by another run while this one started")
    reserved = reserve_on(lake, recipe, [batch_id], now, snapshot)
    return reserved[0] if reserved else None


def reserve_on(
    lake: Lake, recipe: Recipe, batch_ids: list[str], now: datetime, snapshot: DeltaTable | None
) -> list[Reservation]:
    """Plan the next batches, one per id of ``batch_ids`` at most, from one read of the latest
    curated steps, and record the ready ones in one commit (none ready: nothing recorded but
    the retirements), on the ledger as ``snapshot`` (None: no ledger yet) shows it, where
    none of ``batch_ids`` is reserved: a reservation committed since refuses this one (its app
    transaction), so a caller that has read the ledger already need not open it again. A
    release with a backlog thus plans once for all its batches, not once for each."""
    curated = lake.open("curated_steps")
    if curated is None:
        return []
    curated_version = curated.version()
    retirements = Retirements.current(lake, recipe, curated)
    turns = lake.open("turns")
    pins = Pins(
        curated_steps=curated_version,
        steps=lake.version("steps"),
        turns=None if turns is None else turns.version(),
        batch_ledger=-1 if snapshot is None else snapshot.version(),
        batch_retired=retirements.version,
        open_since=retirements.open_since,
        announced_policy_version=highest_announced_version(lake),
        planned_at=now,
        recipe=recipe.model_dump(mode="json", exclude={"exports"}),
    )
    retired = retirements.table if retirements.usable else None
    inputs = PinnedInputs(curated, turns, snapshot, retired)
    plans = plan_pinned(recipe, batch_ids, pins, inputs)
    ready = [plan for plan in plans if plan.ready]
    if not ready:
        retirements.record(plans[0], curated_version, now)
        return []
    reserved = [
        Reservation(plan, pins.model_copy(update={"position": position}))
        for position, plan in enumerate(ready)
    ]
    recorded = [
        r.plan.ledger_rows(recipe.name, now).with_columns(pins=pl.lit(r.pins.model_dump_json()))
        for r in reserved
    ]
    rows = conform(pl.concat(recorded), PINNED_LEDGER)
    done = 0 if snapshot is None else snapshot.transaction_version(_plan_app(recipe.name)) or 0
    target = snapshot or lake.as_created(ledger_table(recipe.name), rows.schema)
    ids = [r.plan.batch_id for r in reserved]
    commit(
        target,
        rows,
        schema_mode="merge",  # a ledger from before a column gains it, null in older rows
        properties=lake.commit_properties(
            {_plan_app(recipe.name): done + len(reserved)}, {"claw.batch_id": ",".join(ids)}
        ),
        compact_after=COMPACT_AFTER_FILES,
        target_size=SETTLED_FILE_BYTES,
        refused=f"another batch of {recipe.name} was reserved while {', '.join(ids)} "
        f"{'was' if len(ids) == 1 else 'were'} planned",
    )
    retirements.record(ready[-1], curated_version, now)  # after: it assumes the batches consumed
    return [  # the pins as a re-plan reads them
        r._replace(pins=Pins.model_validate_json(r.pins.model_dump_json())) for r in reserved
    ]
