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
from assets.quality import curated_steps
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.release import BuiltBatch, ExportedBatch, RaceLost, release_ready
from claw_pipelines.config_files import recipes
from resources.lake import LakeResource


def release_key(recipe: str) -> str:
    return f"release_{recipe}"


def _record_built(context: dg.AssetExecutionContext, built: BuiltBatch) -> None:
    """The batch's partition and its materialization and checks, as its own asset would
    record them."""
    key = batch_key(built.recipe)
    context.instance.add_dynamic_partitions(partitions(built.recipe).name, [built.batch_id])
    log_recipe_edited(context.log, built)
    context.log_event(
        dg.AssetMaterialization(key, partition=built.batch_id, metadata=built_metadata(built))
    )
    for outcome in built.checks:
        check = check_result(outcome)
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=check.check_name,
                passed=check.passed,
                metadata=check.metadata,
                blocking=True,
                partition=built.batch_id,
            )
        )


def release(context: dg.AssetExecutionContext, lake: LakeResource, recipe: Recipe) -> list[str]:
    """Record each batch ``batching.release.release_ready`` builds and exports; their ids."""
    released = []
    with refused_as_failure():
        for event in release_ready(lake.lake(), recipe):
            if isinstance(event, RaceLost):  # a planner or a UI launch got there first
                context.log.info("%s; the next run goes on", event.message)
            elif isinstance(event, BuiltBatch):
                _record_built(context, event)
                released.append(event.batch_id)
            elif isinstance(event, ExportedBatch):
                metadata = export_metadata(event)
                key = export_key(recipe.name)
                context.log_event(
                    dg.AssetMaterialization(key, partition=event.batch_id, metadata=metadata)
                )
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
        released = release(context, lake, recipe)
        return dg.MaterializeResult(
            metadata={"batches": dg.MetadataValue.json(released), "released": len(released)}
        )

    return release_asset


def release_assets() -> list[dg.AssetsDefinition]:
    listed = list(recipes().values())
    return [build_release_asset(r, len(listed) - rank) for rank, r in enumerate(listed)]
