"""``release_<recipe>``: the refresh run builds the batches its new curated steps completed.

It runs right after ``curated_steps`` in the same run (the ingest sensor requests the whole
chain at once), so a batch is reserved, written, checked and exported seconds after its last
trajectory landed, with no sensor tick or run launch in between. Each batch is recorded as a
materialization of its ``batch_<recipe>`` partition (with the batch's checks) and of its
``export_<recipe>`` partition, exactly what the partitioned assets record when they build it;
those stay the way to build a batch from the UI, to re-materialize one, and the planner's and
relauncher's way (a straggler timeout, a run that died after its reservation).
"""

import dagster as dg

from assets.automation import on_new_data
from assets.batch_work import (
    Built,
    batch_key,
    batch_pool,
    build_batch,
    export_key,
    export_written,
    partitions,
)
from assets.landing import OWNERS
from assets.quality import curated_steps
from claw_pipelines.batching import ledger
from claw_pipelines.batching.recipe import Recipe
from claw_pipelines.config_files import recipes
from claw_pipelines.incremental.increment import ConcurrentRun
from claw_pipelines.lake import Lake
from resources.lake import LakeResource

MAX_BATCHES_PER_RUN = 8
"""Batches of one recipe built per run; the next run goes on with the rest."""


def release_key(recipe: str) -> str:
    return f"release_{recipe}"


def _record(context: dg.AssetExecutionContext, recipe: Recipe, batch_id: str, built: Built) -> None:
    """The batch's partition materialization and checks, as its own asset would record them."""
    key = batch_key(recipe.name)
    context.log_event(dg.AssetMaterialization(key, partition=batch_id, metadata=built.metadata))
    for check in built.checks:
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=check.check_name,
                passed=check.passed,
                metadata=check.metadata,
                blocking=True,
                partition=batch_id,
            )
        )


def release(context: dg.AssetExecutionContext, lake: Lake, recipe: Recipe) -> list[str]:
    """Reserve, write, check and export ``recipe``'s ready batches; their ids."""
    released = []
    for _ in range(MAX_BATCHES_PER_RUN):
        batch_id = ledger.next_batch_id(lake, recipe.name)
        try:
            built = build_batch(lake, recipe, batch_id, context.log)
        except ConcurrentRun as race:  # a planner or a UI launch got there first
            context.log.info("%s; the next run goes on", race)
            break
        if built is None:
            break
        context.instance.add_dynamic_partitions(partitions(recipe.name).name, [batch_id])
        _record(context, recipe, batch_id, built)
        if built.passed:  # the blocking checks gate the export, as in a batch's own run
            metadata = export_written(lake, recipe, batch_id, built)
            context.log_event(
                dg.AssetMaterialization(
                    export_key(recipe.name), partition=batch_id, metadata=metadata
                )
            )
        released.append(batch_id)
        if not built.more:  # the next plan would read every curated step in play to find too few
            break
    return released


def build_release_asset(recipe: Recipe, priority: int) -> dg.AssetsDefinition:
    """One per recipe, each in its recipe's batch pool: a recipe with a backlog (many batches
    at once) never holds up another's next batch, and a release never races a UI launch of the
    same recipe. ``priority``: the recipe's rank in batches.yaml (the run's order)."""

    @dg.asset(
        name=release_key(recipe.name),
        group_name="batches",
        kinds={"deltalake", "parquet"},
        owners=OWNERS,
        deps=[curated_steps],
        pool=batch_pool(recipe.name),
        op_tags={"dagster/priority": str(priority)},
        automation_condition=on_new_data(),
        description=(
            f"Builds the `{recipe.name}` batches the new curated steps made ready, in the "
            f"refresh run itself: each is recorded as its batch_{recipe.name} and "
            f"export_{recipe.name} partition."
        ),
    )
    def release_asset(context: dg.AssetExecutionContext, lake: LakeResource):
        released = release(context, lake.lake(), recipe)
        return dg.MaterializeResult(
            metadata={"batches": dg.MetadataValue.json(released), "released": len(released)}
        )

    return release_asset


def release_assets() -> list[dg.AssetsDefinition]:
    listed = list(recipes().values())
    return [build_release_asset(r, len(listed) - rank) for rank, r in enumerate(listed)]
