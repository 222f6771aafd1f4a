"""``batch_release``: the refresh run builds the batches its new curated steps completed.

It runs right after ``curated_steps`` in the same run (the ingest sensor requests the whole
chain at once), so a batch is reserved, written, checked and exported seconds after its last
trajectory landed, with no sensor tick or run launch in between. Each batch is recorded as a
materialization of its ``batch_<recipe>`` partition (with the batch's checks) and of its
``export_<recipe>`` partition, exactly what the partitioned assets record when they build it;
those stay the way to build a batch from the UI, to re-materialize one, and the planner's and
relauncher's way (a straggler timeout, a run that died after its reservation).
"""

import dagster as dg

from assets import ledger
from assets.automation import on_new_data
from assets.batch_work import build_batch, export_written, partitions
from assets.configs import recipes
from assets.incremental import ConcurrentRun
from assets.landing import OWNERS
from assets.quality import curated_steps
from claw_pipelines.lake import Lake
from claw_pipelines.recipes import Recipe
from resources.lake import LakeResource

RELEASE = "batch_release"

BATCHES_PER_RUN = 1
"""Batches of one recipe built per run: the one its new data made ready. A backlog (traffic
that made several at once) is left to the next runs and the planner, so a refresh run stays
short and the next one, which holds the next batch, does not wait for this one's pool."""


def _record(context: dg.AssetExecutionContext, recipe: Recipe, batch_id: str, built) -> None:
    """The batch's partition materialization and checks, as its own asset would record them."""
    key = dg.AssetKey(f"batch_{recipe.name}")
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
    for _ in range(BATCHES_PER_RUN):
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
            metadata = export_written(lake, recipe, batch_id)
            export = dg.AssetKey(f"export_{recipe.name}")
            context.log_event(
                dg.AssetMaterialization(export, partition=batch_id, metadata=metadata)
            )
        released.append(batch_id)
    return released


@dg.asset(
    name=RELEASE,
    group_name="batches",
    kinds={"deltalake", "parquet"},
    owners=OWNERS,
    deps=[curated_steps],
    pool="claw_batch_release",
    automation_condition=on_new_data(),
    description=(
        "Builds every recipe's batches that the new curated steps made ready, in the refresh "
        "run itself: each is recorded as its batch_<recipe> and export_<recipe> partition."
    ),
)
def batch_release(context: dg.AssetExecutionContext, lake: LakeResource):
    the_lake = lake.lake()
    released = {name: release(context, the_lake, recipe) for name, recipe in recipes().items()}
    return dg.MaterializeResult(
        metadata={
            "batches": dg.MetadataValue.json(released),
            "released": sum(len(ids) for ids in released.values()),
        }
    )
