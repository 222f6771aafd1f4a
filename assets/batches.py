"""One batch asset and one export asset per recipe in assets/batches.yaml, plus the planner sensor.

Each batch is a dynamic partition: the sensor reserves the next batch in the recipe's ledger
when enough ready data exists, adds the partition and launches it; a user can also add a
partition in the UI and materialize it (the asset then reserves it itself). Re-materializing a
partition re-plans from its pinned versions, so it rewrites exactly the same rows.
"""

import json
import warnings
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import dagster as dg
import polars as pl
import pyarrow as pa
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError

from assets import ledger
from assets.automation import after_its_batch
from assets.checks import repeated_ids
from assets.configs import recipes
from assets.incremental import COMPACT_AFTER_FILES, WRITER, ConcurrentRun
from assets.landing import OWNERS
from assets.metadata import counts, histogram, markdown_table, table_metadata
from assets.quality import curated_steps
from claw_pipelines.batch_tables import batches_table, exports_folder, ledger_table
from claw_pipelines.derived_schemas import BATCH_ROWS, DPO_PAIRS, conform
from claw_pipelines.exporters import Destination, export_batch
from claw_pipelines.lake import Lake, compact, sql_in
from claw_pipelines.recipes import BatchPlan, Recipe
from claw_pipelines.retired import retired_table
from claw_pipelines.schemas import utc_now
from resources.lake import LakeResource

GROUPED = {"grpo", "rloo"}
"""Algorithms whose batches are made of complete groups (several rollouts of one prompt); DPO
pairs come from one group by construction, other algorithms take single trajectories."""

REPLAN_AFTER_S = 60.0
"""Re-plan at least this often with unchanged inputs, so straggler timeouts can fire."""

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


def partitions(recipe: str) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"batches_{recipe}")


def batch_schema(recipe: Recipe):
    return DPO_PAIRS if recipe.algorithm == "dpo" else BATCH_ROWS


def _prefetched(chunks: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``chunks``, each produced on a worker thread while the previous one is consumed: reading
    the next token lists overlaps writing the current ones (polars and delta-rs release the
    GIL), with at most two chunks in memory."""
    with ThreadPoolExecutor(max_workers=1) as worker:
        pending = worker.submit(next, chunks, None)
        while (chunk := pending.result()) is not None:
            pending = worker.submit(next, chunks, None)
            yield chunk


def _write_batch(lake: Lake, recipe: Recipe, plan: BatchPlan) -> None:
    """Replace the batch's rows in one commit, so a re-run never duplicates them; the rows are
    streamed a chunk at a time, so a big batch never holds all its token lists. A batch is one
    file, so the table is compacted as batches pile up. The schema is merged: a table from
    before a batch column (``request_tools``) gains it, null in older batches' rows."""
    schema = batch_schema(recipe)
    table = lake.ensure(batches_table(recipe.name), schema)
    chunks = (conform(rows, schema) for rows in plan.row_chunks())
    batches = (b for chunk in _prefetched(chunks) for b in chunk.to_batches())
    try:
        write_deltalake(
            table,
            pa.RecordBatchReader.from_batches(schema, batches),
            mode="overwrite",
            predicate=sql_in("batch_id", [plan.batch_id]),
            schema_mode="merge",
            writer_properties=WRITER,
        )
    except CommitFailedError as error:  # e.g. another batch's compaction merged the files read
        raise ConcurrentRun(
            f"another batch of {recipe.name} changed {batches_table(recipe.name)} "
            f"while {plan.batch_id} was written"
        ) from error
    compact(table, max_files=COMPACT_AFTER_FILES, writer_properties=WRITER)


def _group_check(recipe: Recipe, rows: pl.DataFrame) -> dg.AssetCheckResult:
    if recipe.algorithm not in GROUPED:
        return dg.AssetCheckResult(
            check_name="groups_complete", passed=True, metadata={"grouped": False}
        )
    sizes = rows.group_by("group_id").agg(pl.col("trajectory_id").n_unique().alias("size"))
    minimum = 2 if recipe.straggler_policy == "emit" else recipe.group_size
    bad = sizes.filter((pl.col("size") < minimum) | (pl.col("size") > recipe.group_size))
    return dg.AssetCheckResult(
        check_name="groups_complete",
        passed=bad.is_empty() and sizes.height > 0,
        metadata={
            "groups": sizes.height,
            "group_size": recipe.group_size,
            "incomplete_groups": dg.MetadataValue.json(bad.get_column("group_id").to_list()),
        },
    )


def _consumed_once_check(lake: Lake, recipe: str, turn_ids: pl.Series) -> dg.AssetCheckResult:
    """No turn of this batch is in the recipe's ledger twice (within or across batches)."""
    reused = repeated_ids(lake.scan(ledger_table(recipe)), "turn_id", turn_ids)
    return dg.AssetCheckResult(
        check_name="no_step_consumed_twice",
        passed=reused.is_empty(),
        metadata={
            "checked": turn_ids.len(),
            "turns_consumed_twice": reused.len(),
            "examples": dg.MetadataValue.json(reused.head(20).to_list()),
        },
    )


def _retired_before(lake: Lake, recipe: str, pins: dict) -> int:
    """How many steps earlier plans retired (the plan left them out), from the file statistics
    of the pinned version: no data read, however many there are."""
    version = pins.get("batch_retired", -1)
    if version < 0:
        return 0
    files = pl.DataFrame(lake.open(retired_table(recipe), version).get_add_actions(flatten=True))
    return int(files.get_column("num_records").sum()) if files.height else 0


def _decoded(rows: pl.DataFrame, message_column: str) -> pl.DataFrame:
    text = pl.col(message_column).str.json_path_match("$.content").alias("response_text")
    return rows.with_columns(text)


def _batch_checks(recipe: str, parts: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    """Blocking checks kept per batch partition: each batch's result gates its own export.
    Checks kept per asset gate every partition on the latest evaluation, which need not be of
    the latest batch when batches run at once, and an export could then wait forever.
    Partitioned checks are a Dagster preview feature; the lock pins Dagster's exact version,
    so its preview warning is silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(check, asset=f"batch_{recipe}", blocking=True, partitions_def=parts)
            for check in ("groups_complete", "no_step_consumed_twice")
        ]


def build_batch_asset(recipe: Recipe) -> dg.AssetsDefinition:
    name = recipe.name
    parts = partitions(name)

    @dg.asset(
        name=f"batch_{name}",
        group_name="batches",
        kinds={"deltalake", "polars"},
        owners=OWNERS,
        deps=[curated_steps],
        partitions_def=parts,
        pool=f"claw_batch_{name}",
        description=(
            f"Training batches of the `{name}` recipe ({recipe.algorithm}, groups of "
            f"{recipe.group_size}, {recipe.groups_per_batch} per batch): framework-neutral rows "
            f"in `batches/{name}`, one partition per batch."
        ),
        check_specs=_batch_checks(name, parts),
    )
    def batch_asset(context: dg.AssetExecutionContext, lake: LakeResource):
        the_lake = lake.lake()
        batch_id = context.partition_key
        pins = ledger.pins_of(the_lake, name, batch_id)
        if pins is None:
            plan = ledger.reserve(the_lake, recipe, batch_id, utc_now())
            if plan is None:
                raise dg.Failure(f"not enough ready curated steps for a full `{name}` batch yet")
            pins = ledger.pins_of(the_lake, name, batch_id)
            planned_under = recipe
        else:
            planned_under = ledger.pinned_recipe(recipe, pins)
            if planned_under != recipe:
                context.log.info(
                    "%s is re-planned under the recipe it was planned with; the edits to "
                    "assets/batches.yaml apply to new batches",
                    batch_id,
                )
            plan = ledger.plan_from_pins(the_lake, planned_under, batch_id, pins)
        planned_at = datetime.fromisoformat(pins["planned_at"])
        planned = plan.ledger_rows(name, planned_at).get_column("turn_id").sort().to_list()
        if planned != ledger.consumed_turns(the_lake, name, batch_id):
            raise dg.Failure(f"re-planning {batch_id} from its pins did not reproduce its ledger")
        rows = plan.planned
        _write_batch(the_lake, planned_under, plan)
        table = the_lake.open(batches_table(name))
        message = "chosen_message" if recipe.algorithm == "dpo" else "response_message"
        sample = _decoded(rows, message).select(
            [c for c in ("group_id", "trajectory_id", "step_index", "reward", "chosen_reward")
             if c in rows.columns] + ["response_text"]
        ).head(8)  # fmt: skip
        reward = "chosen_reward" if recipe.algorithm == "dpo" else "reward"
        return dg.MaterializeResult(
            metadata={
                **table_metadata(table, the_lake.uri(batches_table(name))),
                "dagster/partition_row_count": rows.height,
                "batch_id": batch_id,
                "pinned_versions": dg.MetadataValue.json(pins),
                "groups": rows.get_column("group_id").n_unique(),
                "trajectories": rows.get_column("trajectory_id").n_unique(),
                "sample": dg.MetadataValue.md(markdown_table(sample)),
                "reward_distribution": histogram(rows.get_column(reward)),
                "dropped": dg.MetadataValue.json(counts(plan.dropped, "reason")),
                "retired": dg.MetadataValue.json(counts(plan.final, "reason")),
                "retired_before": _retired_before(the_lake, name, pins),
            },
            check_results=[
                _group_check(planned_under, rows),
                _consumed_once_check(the_lake, name, pl.Series(planned, dtype=pl.String)),
            ],
        )

    return batch_asset


def build_export_asset(recipe: Recipe, batch_asset: dg.AssetsDefinition) -> dg.AssetsDefinition:
    name = recipe.name

    @dg.asset(
        name=f"export_{name}",
        group_name="exports",
        kinds={"parquet", "json"},
        owners=OWNERS,
        deps=[batch_asset],
        partitions_def=partitions(name),
        automation_condition=after_its_batch(),
        retry_policy=EXPORT_RETRIES,
        description=(
            f"`{name}` batches in the trainers' formats ({', '.join(recipe.exports)}) under "
            f"`exports/{name}/<batch_id>/` with a manifest.json."
        ),
    )
    def export_asset(context: dg.AssetExecutionContext, lake: LakeResource):
        the_lake = lake.lake()
        batch_id = context.partition_key
        rows = the_lake.scan(batches_table(name)).filter(pl.col("batch_id") == batch_id).collect()
        if rows.is_empty():
            raise dg.Failure(f"batch {batch_id} has no rows in batches/{name}")
        pins = ledger.pins_of(the_lake, name, batch_id) or {}
        planned_under = ledger.pinned_recipe(recipe, pins)
        failed = [
            check.check_name
            for check in (
                _group_check(planned_under, rows),
                _consumed_once_check(
                    the_lake, name, pl.Series(ledger.consumed_turns(the_lake, name, batch_id))
                ),
            )
            if not check.passed
        ]
        if failed:  # an export launched alone (UI, relauncher) is not gated by the batch's run
            raise dg.Failure(
                f"batch {batch_id} fails {', '.join(failed)}: not exported", allow_retries=False
            )
        folder = f"{exports_folder(name)}/{batch_id}"
        out = Destination(the_lake.uri(folder), the_lake.storage_options)
        manifest = export_batch(
            planned_under,  # its widths and pad id, with today's export formats
            rows,
            out,
            source_versions=json.loads(rows["source_versions"][0]),
            planned_with=pins or None,
        )
        files = pl.DataFrame([f.model_dump() for f in manifest.files])
        return dg.MaterializeResult(
            metadata={
                "dagster/uri": dg.MetadataValue.path(out.root),
                "dagster/partition_row_count": manifest.rows,
                "files": dg.MetadataValue.md(markdown_table(files)),
                "manifest": dg.MetadataValue.json(manifest.model_dump()),
            }
        )

    return export_asset


def _batch_runs(
    parts: dg.DynamicPartitionsDefinition,
    batch_asset: dg.AssetsDefinition,
    export_asset: dg.AssetsDefinition,
    run_keys: dict[str, str],
    cursor: str,
    written: Collection[str] = (),
) -> dg.SensorResult:
    """A sensor's result launching batches (``run_keys``: batch id -> run key) with their
    exports, or only the export of those already ``written``, one run each, adding their
    partitions (Dagster skips those already there)."""
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                partition_key=batch_id,
                asset_selection=[export_asset.key]
                if batch_id in written
                else [batch_asset.key, export_asset.key],
                run_key=run_key,
            )
            for batch_id, run_key in run_keys.items()
        ],
        dynamic_partitions_requests=[parts.build_add_request(list(run_keys))],
        cursor=cursor,
    )


def build_planner_sensor(
    recipe: Recipe,
    batch_asset: dg.AssetsDefinition,
    export_asset: dg.AssetsDefinition,
    interval_s: int,
) -> dg.SensorDefinition:
    """The sensor launches each batch and its export in one run (the export step runs once the
    batch's blocking checks pass): half the runs of leaving the export to automation, which
    still exports batches launched from the UI."""
    name = recipe.name
    parts = partitions(name)

    @dg.sensor(
        name=f"batch_{name}_planner",
        asset_selection=[batch_asset, export_asset],
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Reserves and launches the next `{name}` batch once enough data is ready.",
    )
    def planner(context: dg.SensorEvaluationContext, lake: LakeResource):
        the_lake = lake.lake()
        seen = json.loads(context.cursor) if context.cursor else {}
        inputs = {
            "curated_steps": the_lake.version("curated_steps"),
            "batch_ledger": the_lake.version(ledger_table(name)),
        }
        now = utc_now()
        recent = seen.get("planned_at") and (
            (now - datetime.fromisoformat(seen["planned_at"])).total_seconds() < REPLAN_AFTER_S
        )
        if inputs["curated_steps"] is None or (seen.get("inputs") == inputs and recent):
            return dg.SkipReason("no new curated steps since the last plan")
        reserved, raced = [], False
        for _ in range(MAX_BATCHES_PER_TICK):
            batch_id = ledger.next_batch_id(the_lake, name)
            try:
                if ledger.reserve(the_lake, recipe, batch_id, now) is None:
                    break
            except ConcurrentRun as race:  # a batch launched from the UI reserved first
                context.log.info("%s; the next tick plans again", race)
                raced = True
                break
            reserved.append(batch_id)
        inputs["batch_ledger"] = the_lake.version(ledger_table(name))
        planned = None if raced else inputs  # a raced tick did not plan everything: no skip next
        cursor = json.dumps({"inputs": planned, "planned_at": now.isoformat()})
        if not reserved:
            context.update_cursor(cursor)
            return dg.SkipReason(f"not enough ready data for a `{name}` batch")
        launches = {k: k for k in reserved}
        return _batch_runs(parts, batch_asset, export_asset, launches, cursor)

    return planner


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


def build_relaunch_sensor(
    recipe: Recipe, batch_asset: dg.AssetsDefinition, export_asset: dg.AssetsDefinition
) -> dg.SensorDefinition:
    """Launches again the reserved batches that are not written or not exported and have no run
    to come in this instance: their run was lost (a temporary instance starts without the old
    queue, run keys and materializations) or failed (a dead worker, failed by run monitoring,
    or an export that failed all its retries). Their steps are consumed in the ledger, so
    nothing else would ever write or export them. An unwritten batch is launched with its
    export and re-planned from the pins, so it writes exactly the reserved steps; a written one
    is only exported. A fresh run key per attempt keeps Dagster from deduplicating it; after
    ``MAX_BATCH_RUNS`` runs in this instance the batch is only logged. A run finishing between
    the lake read and the run query gets one more run, which rewrites the same files.

    The cursor is the reservation time before which every batch is finished or given up, so a
    tick checks only the reservations since (their manifests one by one): its cost follows the
    backlog, not the ledger. A temporary instance starts without it and checks them all once."""
    name = recipe.name
    parts = partitions(name)

    @dg.sensor(
        name=f"batch_{name}_relauncher",
        asset_selection=[batch_asset, export_asset],
        minimum_interval_seconds=RELAUNCH_EVERY_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Relaunches reserved `{name}` batches whose run was lost or failed.",
    )
    def relauncher(context: dg.SensorEvaluationContext, lake: LakeResource):
        reserved_before = utc_now() - timedelta(seconds=RELAUNCH_AFTER_S)
        finished_before = datetime.fromisoformat(context.cursor) if context.cursor else None
        unfinished = ledger.unfinished_batches(lake.lake(), name, reserved_before, finished_before)
        if unfinished.is_empty():
            context.update_cursor(reserved_before.isoformat())
            return dg.SkipReason(
                f"every reserved `{name}` batch is written and exported or just reserved"
            )
        keys = [batch_asset.key, export_asset.key]
        runs = _runs_of(context.instance, keys, unfinished.get_column("batch_id").to_list())
        idle = (
            unfinished.join(runs, on="batch_id", how="left", maintain_order="left")
            .group_by("batch_id", "written", maintain_order=True)
            .agg(runs=pl.col("pending").count(), pending=pl.col("pending").any())
            .filter(~pl.col("pending"))
        )
        given_up = idle.filter(pl.col("runs") >= MAX_BATCH_RUNS).get_column("batch_id")
        in_play = unfinished.filter(~pl.col("batch_id").is_in(given_up.implode()))
        cursor = (in_play.get_column("planned_at").min() or reserved_before).isoformat()
        if not given_up.is_empty():
            context.log.warning(
                "not relaunching %s: reserved, never written or exported, and already run %d "
                "times in this instance; materialize them from the UI once the cause is fixed",
                ", ".join(given_up),
                MAX_BATCH_RUNS,
            )
        relaunched = (
            idle.filter(pl.col("runs") < MAX_BATCH_RUNS)
            .head(MAX_BATCHES_PER_TICK)
            .select(
                "batch_id",
                "written",
                run_key=pl.format("{}/attempt-{}", "batch_id", pl.col("runs") + 1),
            )
        )
        if relaunched.is_empty():
            context.update_cursor(cursor)
            return dg.SkipReason(
                f"unfinished `{name}` batches: {unfinished.height - idle.height} with a run to "
                f"come, {given_up.len()} given up after {MAX_BATCH_RUNS} runs"
            )
        context.log.info(
            "relaunching %s: reserved, never written or exported, no run to come in this instance",
            ", ".join(relaunched.get_column("batch_id")),
        )
        launches = dict(relaunched.select("batch_id", "run_key").iter_rows())
        written = relaunched.filter("written").get_column("batch_id").to_list()
        return _batch_runs(parts, batch_asset, export_asset, launches, cursor, written)

    return relauncher


def build_recipe_definitions(interval_s: int) -> dg.Definitions:
    """Batch and export assets plus the planner and relauncher sensors for every declared
    recipe."""
    assets, sensors = [], []
    for recipe in recipes().values():
        batch_asset = build_batch_asset(recipe)
        export_asset = build_export_asset(recipe, batch_asset)
        assets += [batch_asset, export_asset]
        sensors += [
            build_planner_sensor(recipe, batch_asset, export_asset, interval_s),
            build_relaunch_sensor(recipe, batch_asset, export_asset),
        ]
    return dg.Definitions(assets=assets, sensors=sensors)
