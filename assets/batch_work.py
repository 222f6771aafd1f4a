"""The work of one batch, shared by the partitioned batch and export assets and by the release
asset that builds ready batches in the refresh run itself: build it (``batching.building``),
check it, export it. Each returns what Dagster records (metadata, check results), so the
caller decides whether that is its own output or a logged materialization of
the batch's partition."""

import json
import warnings
from dataclasses import dataclass

import dagster as dg
import polars as pl

from assets.checks import repeated_ids
from assets.metadata import counts, histogram, markdown_table, table_metadata
from claw_pipelines.batches.names import batches_table, exports_folder, ledger_table
from claw_pipelines.batches.rows import completed_chunks, stored_rows
from claw_pipelines.batching import ledger
from claw_pipelines.batching.building import planned, retired_before, write_batch
from claw_pipelines.batching.recipe import GROUPED, Recipe
from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.exporters import Destination, export_chunks
from claw_pipelines.lake import Lake


def partitions(recipe: str) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=f"batches_{recipe}")


def batch_key(recipe: str) -> dg.AssetKey:
    """The partitioned batch asset of ``recipe``, which the release asset also records."""
    return dg.AssetKey(f"batch_{recipe}")


def export_key(recipe: str) -> dg.AssetKey:
    return dg.AssetKey(f"export_{recipe}")


def batch_pool(recipe: str) -> str:
    """The pool of ``recipe``'s batch and release steps: they share it, so a release never
    races a UI launch of the same recipe (dagster.yaml: one slot per pool)."""
    return f"claw_batch_{recipe}"


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


def _decoded(lake: Lake, rows: pl.DataFrame, algorithm: str) -> pl.DataFrame:
    """``rows`` with their reply's text: dpo pairs carry the chosen message, step rows read
    theirs from ``turns`` (batches point at their turns)."""
    if algorithm == "dpo":
        message = pl.col("chosen_message")
    else:
        rows = with_turn_columns(rows, lake.scan("turns"), ["response_message"])
        message = pl.col("response_message")
    return rows.with_columns(message.str.json_path_match("$.content").alias("response_text"))


def batch_checks(recipe: str, parts: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    """Blocking checks kept per batch partition: each batch's result gates its own export.
    Checks kept per asset gate every partition on the latest evaluation, which need not be of
    the latest batch when batches run at once, and an export could then wait forever.
    Partitioned checks are a Dagster preview feature; the lock pins Dagster's exact version,
    so its preview warning is silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(check, asset=batch_key(recipe), blocking=True, partitions_def=parts)
            for check in ("groups_complete", "no_step_consumed_twice")
        ]


@dataclass(frozen=True)
class Built:
    """A written batch: what its partition's materialization records."""

    metadata: dict
    checks: list[dg.AssetCheckResult]
    planned_under: Recipe
    pins: dict
    more: bool
    """Another batch could be ready right after this one: false only when this batch was
    reserved now and its plan left too few units for another (``BatchPlan.more``)."""

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)


def build_batch(lake: Lake, recipe: Recipe, batch_id: str, log) -> Built | None:
    """Plan and write ``batch_id`` (None: not reserved and not enough ready data for it). A
    batch re-planned from its pins must reproduce the steps its reservation consumed."""
    name = recipe.name
    found = planned(lake, recipe, batch_id)
    if found is None:
        return None
    plan, planned_under, pins, reserved_now = found
    if planned_under != recipe:
        log.info(
            "%s is re-planned under the recipe it was planned with; the edits to "
            "assets/batches.yaml apply to new batches",
            batch_id,
        )
    consumed = plan.consumed.get_column("turn_id").sort()
    if not reserved_now and consumed.to_list() != ledger.consumed_turns(lake, name, batch_id):
        raise dg.Failure(f"re-planning {batch_id} from its pins did not reproduce its ledger")
    rows = plan.planned
    table = write_batch(lake, planned_under, plan)
    sample = _decoded(lake, rows.head(8), recipe.algorithm).select(
        [c for c in ("group_id", "trajectory_id", "step_index", "reward", "chosen_reward")
         if c in rows.columns] + ["response_text"]
    )  # fmt: skip
    reward = "chosen_reward" if recipe.algorithm == "dpo" else "reward"
    metadata = {
        **table_metadata(table, lake.uri(batches_table(name))),
        "dagster/partition_row_count": rows.height,
        "batch_id": batch_id,
        "pinned_versions": dg.MetadataValue.json(pins),
        "groups": rows.get_column("group_id").n_unique(),
        "trajectories": rows.get_column("trajectory_id").n_unique(),
        "sample": dg.MetadataValue.md(markdown_table(sample)),
        "reward_distribution": histogram(rows.get_column(reward)),
        "dropped": dg.MetadataValue.json(counts(plan.dropped, "reason")),
        "retired": dg.MetadataValue.json(counts(plan.final, "reason")),
        "retired_before": retired_before(lake, name, pins),
    }
    checks = [
        _group_check(planned_under, rows),
        _consumed_once_check(lake, name, consumed),
    ]
    return Built(metadata, checks, planned_under, pins, plan.more or not reserved_now)


def _recheck(lake: Lake, recipe: Recipe, batch_id: str, rows: pl.DataFrame) -> tuple[Recipe, dict]:
    """The batch's pinned recipe and pins, once its checks pass again (an export launched alone
    is not gated by its batch's run)."""
    pins = ledger.pins_of(lake, recipe.name, batch_id) or {}
    planned_under = ledger.pinned_recipe(recipe, pins)
    consumed = pl.Series(ledger.consumed_turns(lake, recipe.name, batch_id))
    checks = (_group_check(planned_under, rows), _consumed_once_check(lake, recipe.name, consumed))
    failed = [check.check_name for check in checks if not check.passed]
    if failed:
        raise dg.Failure(
            f"batch {batch_id} fails {', '.join(failed)}: not exported", allow_retries=False
        )
    return planned_under, pins


def export_written(lake: Lake, recipe: Recipe, batch_id: str, built: Built | None = None) -> dict:
    """Export the written ``batch_id`` and return its materialization metadata; ``built``: the
    batch was just built and checked in this step, so it is not checked again."""
    name = recipe.name
    rows = stored_rows(lake, name, recipe.algorithm, batch_id)
    if rows.is_empty():
        raise dg.Failure(f"batch {batch_id} has no rows in batches/{name}")
    if built is None:
        planned_under, pins = _recheck(lake, recipe, batch_id, rows)
    else:
        planned_under, pins = built.planned_under, built.pins
    out = Destination(lake.uri(f"{exports_folder(name)}/{batch_id}"), lake.storage_options)
    manifest = export_chunks(
        planned_under,  # its layout, widths and pad id, with today's export formats
        completed_chunks(lake, recipe.algorithm, rows, planned_under.layout or "step"),
        out,
        source_versions=json.loads(rows["source_versions"][0]),
        planned_with=pins or None,
    )
    files = pl.DataFrame([f.model_dump() for f in manifest.files])
    return {
        "dagster/uri": dg.MetadataValue.path(out.root),
        "dagster/partition_row_count": manifest.rows,
        "files": dg.MetadataValue.md(markdown_table(files)),
        "manifest": dg.MetadataValue.json(manifest.model_dump(mode="json")),
    }
