"""One batch asset and one export asset per recipe in assets/batches.yaml, plus the planner sensor.

Each batch is a dynamic partition. Batches are mostly built by the refresh run that made them
ready (``assets.release``), which records their partitions; the planner sensor reserves the next
batch when enough ready data exists that no refresh run built (a straggler timeout), adds the
partition and launches it; a user can also add a partition in the UI and materialize it (the
asset then reserves it itself). Re-materializing a partition re-plans from its pinned versions,
so it rewrites exactly the same rows.
"""

import json
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import NamedTuple, Self

import dagster as dg
import polars as pl
from pydantic import BaseModel

from assets.batch_work import (
    batch_checks,
    batch_key,
    batch_pool,
    built_metadata,
    check_result,
    export_key,
    export_metadata,
    log_recipe_edited,
    partitions,
    refused_as_failure,
)
from assets.landing import OWNERS
from assets.metadata import declared_columns
from assets.quality import curated_steps
from assets.races import retried_when_raced
from assets.release import release_key
from assets.runs import TO_COME, has_run
from claw_pipelines.batches.names import MANIFEST, batches_table, exports_folder, ledger_table
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching import ledger
from claw_pipelines.batching.building import batch_schema
from claw_pipelines.batching.release import build_batch, export_batch, failed_checks
from claw_pipelines.config_files import recipes
from claw_pipelines.lake import Lake
from claw_pipelines.lake.commits import ConcurrentRun
from claw_pipelines.schemas import utc_now
from resources.lake import LakeResource

REPLAN_AFTER_S = 60.0
"""Re-plan at least this often with unchanged inputs, so straggler timeouts can fire."""

PLAN_EVERY_S = 30
"""The planner's interval: every refresh run builds the batches it made ready
(``assets.release``), so the planner only catches what no new data triggers (straggler
timeouts) and batches whose release lost a race."""

MAX_BATCHES_PER_TICK = 8

RELAUNCH_EVERY_S = 30
"""How often the relauncher looks for reserved batches whose run was lost."""

RELAUNCH_AFTER_S = 60.0
"""A reservation younger than this may still have its run on the way (Dagster creates a
sensor's runs after its tick), so the relauncher leaves it alone."""

MAX_BATCH_RUNS = 3
"""Runs of one batch in an instance after which the relauncher gives up on it: a batch that
fails every time (a planning error, a bug) needs a person, not a loop."""

EXPORT_RETRIES = dg.RetryPolicy(max_retries=3, delay=2.0, backoff=dg.Backoff.EXPONENTIAL)
"""An export only writes files (the manifest last, so a reader never sees half an export): a
failed write, say a network blip or a throttled object store, is retried in the same run,
since nothing else would run the export of a batch its run already built."""

PARTITION_TAG = "dagster/partition"
"""The system tag Dagster puts on every run of a partition."""


def build_batch_asset(recipe: Recipe) -> dg.AssetsDefinition:
    name = recipe.name
    parts = partitions(name)

    @dg.asset(
        key=batch_key(name),
        group_name="batches",
        kinds={"deltalake", "polars"},
        owners=OWNERS,
        deps=[curated_steps],
        partitions_def=parts,
        pool=batch_pool(name),
        description=(
            f"Training batches of the `{name}` recipe ({recipe.algorithm}, groups of "
            f"{recipe.group_size}, {recipe.groups_per_batch} per batch): framework-neutral rows "
            f"in `{batches_table(name)}`, one partition per batch."
        ),
        check_specs=batch_checks(name, parts),
        metadata=declared_columns(batch_schema(recipe)),
    )
    @retried_when_raced
    def batch_asset(context: dg.AssetExecutionContext, lake: LakeResource):
        with refused_as_failure():
            built = build_batch(lake.lake(), recipe, context.partition_key)
        if built is None:
            raise dg.Failure(f"not enough ready curated steps for a full `{name}` batch yet")
        log_recipe_edited(context.log, built)
        return dg.MaterializeResult(
            metadata=built_metadata(built), check_results=[check_result(c) for c in built.checks]
        )

    return batch_asset


def build_export_asset(recipe: Recipe, batch_asset: dg.AssetsDefinition) -> dg.AssetsDefinition:
    name = recipe.name

    @dg.asset(
        key=export_key(name),
        group_name="exports",
        kinds={"parquet", "json"},
        owners=OWNERS,
        deps=[batch_asset],
        partitions_def=partitions(name),
        retry_policy=EXPORT_RETRIES,
        description=(
            f"`{name}` batches in the trainers' formats ({', '.join(recipe.exports)}) under "
            f"`{exports_folder(name)}/<batch_id>/` with a {MANIFEST}."
        ),
    )
    def export_asset(context: dg.AssetExecutionContext, lake: LakeResource):
        with refused_as_failure():
            exported = export_batch(lake.lake(), recipe, context.partition_key)
        return dg.MaterializeResult(metadata=export_metadata(exported))

    return export_asset


class RecipeAssets(NamedTuple):
    """A recipe's partitioned batch and export assets: what its sensors launch."""

    recipe: Recipe
    batch: dg.AssetsDefinition
    export: dg.AssetsDefinition

    def launch(
        self, run_keys: dict[str, str], cursor: str, written: Collection[str] = ()
    ) -> dg.SensorResult:
        """A sensor's result launching batches (``run_keys``: batch id -> run key) with their
        exports, or only the export of those already ``written``, one run each, adding their
        partitions (Dagster skips those already there)."""
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    partition_key=batch_id,
                    asset_selection=[self.export.key]
                    if batch_id in written
                    else [self.batch.key, self.export.key],
                    run_key=run_key,
                )
                for batch_id, run_key in run_keys.items()
            ],
            dynamic_partitions_requests=[
                partitions(self.recipe.name).build_add_request(list(run_keys))
            ],
            cursor=cursor,
        )


def build_planner_sensor(assets: RecipeAssets, interval_s: int) -> dg.SensorDefinition:
    """The sensor launches each batch and its export in one run (the export step runs once the
    batch's blocking checks pass)."""
    name = assets.recipe.name

    @dg.sensor(
        name=f"batch_{name}_planner",
        asset_selection=[assets.batch, assets.export],
        minimum_interval_seconds=max(interval_s, PLAN_EVERY_S),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Reserves and launches the next `{name}` batch once enough data is ready.",
    )
    def planner(context: dg.SensorEvaluationContext, lake: LakeResource):
        return plan_tick(context, lake.lake(), assets)

    return planner


def plan_tick(
    context: dg.SensorEvaluationContext, lake: Lake, assets: RecipeAssets
) -> dg.SensorResult | dg.SkipReason:
    """Reserve and launch the batches ready now, unless nothing changed since the last plan
    (``REPLAN_AFTER_S`` ago at most) or a refresh run on its way will build them."""
    name = assets.recipe.name
    seen = json.loads(context.cursor) if context.cursor else {}
    inputs = {
        "curated_steps": lake.version("curated_steps"),
        "batch_ledger": lake.version(ledger_table(name)),
    }
    now = utc_now()
    recent = seen.get("planned_at") and (
        (now - datetime.fromisoformat(seen["planned_at"])).total_seconds() < REPLAN_AFTER_S
    )
    if inputs["curated_steps"] is None or (seen.get("inputs") == inputs and recent):
        return dg.SkipReason("no new curated steps since the last plan")
    if has_run(context.instance, release_key(name), TO_COME):
        return dg.SkipReason("a refresh run is on its way: it builds the batches it makes ready")
    reserved = _reserve_ready(context, lake, assets.recipe, now)
    inputs["batch_ledger"] = lake.version(ledger_table(name))
    planned = None if reserved.raced else inputs  # a raced tick did not plan all: no skip next
    cursor = json.dumps({"inputs": planned, "planned_at": now.isoformat()})
    if not reserved.batch_ids:
        context.update_cursor(cursor)
        return dg.SkipReason(f"not enough ready data for a `{name}` batch")
    return assets.launch({k: k for k in reserved.batch_ids}, cursor)


class Reserved(NamedTuple):
    batch_ids: list[str]
    raced: bool
    """A batch launched from the UI reserved first, so more may be ready than were reserved."""


def _reserve_ready(
    context: dg.SensorEvaluationContext, lake: Lake, recipe: Recipe, now: datetime
) -> Reserved:
    """Reserve the ready batches, ``MAX_BATCHES_PER_TICK`` at most."""
    reserved: list[str] = []
    for _ in range(MAX_BATCHES_PER_TICK):
        batch_id = ledger.next_batch_id(lake, recipe.name)
        try:
            if ledger.reserve(lake, recipe, batch_id, now) is None:
                break
        except ConcurrentRun as race:
            context.log.info("%s; the next tick plans again", race)
            return Reserved(reserved, raced=True)
        reserved.append(batch_id)
    return Reserved(reserved, raced=False)


def _runs_of(
    instance: dg.DagsterInstance, keys: list[dg.AssetKey], batch_ids: list[str]
) -> pl.DataFrame:
    """This instance's runs of any of ``keys`` for ``batch_ids``: the batch each ran and whether
    it is still to come (queued, starting, running, or failed with a retry of Dagster's own
    ``run_retries`` pending)."""
    runs = [
        run
        for run in instance.get_runs(filters=dg.RunsFilter(tags={PARTITION_TAG: batch_ids}))
        if not set(keys).isdisjoint(run.asset_selection or ())
    ]
    return pl.DataFrame(
        {
            "batch_id": [run.tags[PARTITION_TAG] for run in runs],
            "pending": [
                not run.is_finished or run.is_complete_and_waiting_to_retry for run in runs
            ],
        },
        schema={"batch_id": pl.String, "pending": pl.Boolean},
    )


def build_relaunch_sensor(assets: RecipeAssets) -> dg.SensorDefinition:
    """Launches again the reserved batches that are not written or not exported and have no run
    to come in this instance: their run was lost (a temporary instance starts without the old
    queue, run keys and materializations) or failed (a dead worker, failed by run monitoring,
    or an export that failed all its retries), or it built the batch alone (a partition
    materialized from the UI without its export). Their steps are consumed in the ledger, so
    nothing else would ever write or export them. An unwritten batch is launched with its
    export and re-planned from the pins, so it writes exactly the reserved steps; a written one
    is only exported, unless it fails a check (a warning says which). A fresh run key per
    attempt keeps Dagster from deduplicating it; after ``MAX_BATCH_RUNS`` runs in this instance
    the batch is only logged. A run finishing between the lake read and the run query gets one
    more run, which rewrites the same files. (Declarative automation used to export a batch
    built alone, gated on the batch's blocking checks, whose state Dagster re-reads over every
    partition on every tick: its daemon's work grew with the batches ever built.)

    The cursor is the reservation time before which every batch is finished or given up, so a
    tick checks only the reservations since (their manifests one by one): its cost follows the
    backlog, not the ledger. It also keeps the batches given up since then, so each is logged
    once. A temporary instance starts without it and checks them all once."""
    name = assets.recipe.name

    @dg.sensor(
        name=f"batch_{name}_relauncher",
        asset_selection=[assets.batch, assets.export],
        minimum_interval_seconds=RELAUNCH_EVERY_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Relaunches reserved `{name}` batches whose run was lost or failed.",
    )
    def relauncher(context: dg.SensorEvaluationContext, lake: LakeResource):
        return relaunch_tick(context, lake.lake(), assets)

    return relauncher


class RelaunchCursor(BaseModel):
    """The relauncher's cursor: every batch reserved before ``finished_before`` is finished or
    given up, and ``given_up`` are the batches since then it already said it gave up on, so an
    older batch still in play (holding ``finished_before`` back) does not have them logged again
    every tick."""

    finished_before: datetime
    given_up: list[str] = []

    @classmethod
    def parse(cls, text: str | None) -> Self | None:
        """The cursor a tick stored; a bare time is one stored before ``given_up`` was kept."""
        if not text:
            return None
        if text.startswith("{"):
            return cls.model_validate_json(text)
        return cls(finished_before=datetime.fromisoformat(text))


class Relaunch(NamedTuple):
    """What a relauncher tick decided about the unfinished batches."""

    relaunched: pl.DataFrame
    """batch_id, written and run_key of each batch to launch again."""
    given_up: pl.Series
    """The batches already run ``MAX_BATCH_RUNS`` times in this instance, and the written ones
    that fail a check (their export would refuse them)."""
    to_come: int
    """How many unfinished batches have a run to come."""
    cursor: datetime
    """The reservation time before which every batch is finished or given up."""


def relaunch_choices(
    unfinished: pl.DataFrame,
    runs: pl.DataFrame,
    reserved_before: datetime,
    refused: Collection[str] = (),
) -> Relaunch:
    """Which of the ``unfinished`` batches (``ledger.unfinished_batches``) to launch again,
    given this instance's ``runs`` of them (``_runs_of``) and the written ones whose checks
    fail (``refused``)."""
    idle = (
        unfinished.join(runs, on="batch_id", how="left", maintain_order="left")
        .group_by("batch_id", "written", maintain_order=True)
        .agg(runs=pl.col("pending").count(), pending=pl.col("pending").any())
        .filter(~pl.col("pending"))
    )
    stopped = (pl.col("runs") >= MAX_BATCH_RUNS) | pl.col("batch_id").is_in(list(refused))
    given_up = idle.filter(stopped).get_column("batch_id")
    in_play = unfinished.filter(~pl.col("batch_id").is_in(given_up.implode()))
    relaunched = (
        idle.filter(~stopped)
        .head(MAX_BATCHES_PER_TICK)
        .select(
            "batch_id",
            "written",
            run_key=pl.format("{}/attempt-{}", "batch_id", pl.col("runs") + 1),
        )
    )
    cursor = in_play.get_column("planned_at").min() or reserved_before
    return Relaunch(relaunched, given_up, unfinished.height - idle.height, cursor)


def relaunch_tick(
    context: dg.SensorEvaluationContext, lake: Lake, assets: RecipeAssets
) -> dg.SensorResult | dg.SkipReason:
    """Launch again the unfinished batches reserved before ``RELAUNCH_AFTER_S`` ago (and since
    the cursor) that have no run to come."""
    name = assets.recipe.name
    reserved_before = utc_now() - timedelta(seconds=RELAUNCH_AFTER_S)
    stored = RelaunchCursor.parse(context.cursor)
    finished_before = stored.finished_before if stored else None
    unfinished = ledger.unfinished_batches(lake, name, reserved_before, finished_before)
    if unfinished.is_empty():
        context.update_cursor(RelaunchCursor(finished_before=reserved_before).model_dump_json())
        return dg.SkipReason(
            f"every reserved `{name}` batch is written and exported or just reserved"
        )
    keys = [assets.batch.key, assets.export.key]
    runs = _runs_of(context.instance, keys, unfinished.get_column("batch_id").to_list())
    refused = {
        batch_id: failed
        for batch_id in unfinished.filter("written").get_column("batch_id")
        if (failed := failed_checks(lake, assets.recipe, batch_id))
    }
    choice = relaunch_choices(unfinished, runs, reserved_before, refused)
    given_up = choice.given_up.to_list()
    cursor = RelaunchCursor(finished_before=choice.cursor, given_up=given_up).model_dump_json()
    said = set(stored.given_up) if stored else set()
    for batch_id in given_up:
        if batch_id in said:
            continue
        if batch_id in refused:
            context.log.warning(
                "not exporting %s: it fails %s; materialize it again from the UI once the "
                "cause is fixed", batch_id, ", ".join(refused[batch_id]),
            )  # fmt: skip
        else:
            context.log.warning(
                "not relaunching %s: reserved, never written or exported, and already run %d "
                "times in this instance; materialize it from the UI once the cause is fixed",
                batch_id,
                MAX_BATCH_RUNS,
            )
    relaunched = choice.relaunched
    if relaunched.is_empty():
        context.update_cursor(cursor)
        return dg.SkipReason(
            f"unfinished `{name}` batches: {choice.to_come} with a run to come, "
            f"{choice.given_up.len()} given up (failed checks, or {MAX_BATCH_RUNS} runs)"
        )
    context.log.info(
        "relaunching %s: reserved, never written or exported, no run to come in this instance",
        ", ".join(relaunched.get_column("batch_id")),
    )
    launches = dict(relaunched.select("batch_id", "run_key").iter_rows())
    written = relaunched.filter("written").get_column("batch_id").to_list()
    return assets.launch(launches, cursor, written)


def build_recipe_definitions(interval_s: int) -> dg.Definitions:
    """Batch and export assets plus the planner and relauncher sensors for every declared
    recipe."""
    assets, sensors = [], []
    for recipe in recipes().values():
        batch_asset = build_batch_asset(recipe)
        recipe_assets = RecipeAssets(recipe, batch_asset, build_export_asset(recipe, batch_asset))
        assets += [recipe_assets.batch, recipe_assets.export]
        sensors += [
            build_planner_sensor(recipe_assets, interval_s),
            build_relaunch_sensor(recipe_assets),
        ]
    return dg.Definitions(assets=assets, sensors=sensors)
