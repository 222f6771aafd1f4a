"""Quality scoring and human curation: the last steps before a step can enter a batch."""

import dagster as dg
import polars as pl

from assets.incremental import Refreshed, incremental_asset
from assets.metadata import counts, histogram, sample
from claw_pipelines.config_files import quality_config
from claw_pipelines.derived_schemas import CURATED_STEPS, SCORED_STEPS, empty
from claw_pipelines.incremental.increment import Increment, trajectory_ids
from claw_pipelines.policy.versions import highest_announced_version, lag_reference
from claw_pipelines.transforms.curation import curate_steps
from claw_pipelines.transforms.quality import score_steps


@incremental_asset("scored_steps", sources=["rewarded_steps"], schema=SCORED_STEPS, group="quality")
def scored_steps(context: dg.AssetExecutionContext, increment: Increment) -> Refreshed:
    """A quality score in [0, 1] per step and the reasons that lowered it.

    Signals and weights come from assets/quality.yaml; trajectories re-credited upstream are
    re-scored and their rows replaced. Token signals come from what the step extractor stored
    (``SIGNAL_COLUMNS``), or else from the rows' token lists read from ``turns``.
    """
    affected = trajectory_ids(increment.new_rows("rewarded_steps", ["trajectory_id"]))
    latest_policy = None
    if affected.len():
        announced = highest_announced_version(increment.lake)
        latest_policy = lag_reference(announced, increment.inputs["rewarded_steps"])

    turns = pl.scan_delta(  # by URI: opened only if some rows need their token lists (~5 ms)
        increment.lake.uri("turns"), storage_options=increment.lake.storage_options or None
    )

    def build(keys: pl.Series) -> pl.DataFrame:
        return score_steps(
            increment.rows_where("rewarded_steps", "trajectory_id", keys),
            turns,
            quality_config(),
            latest_policy_version=latest_policy,
        ).collect()

    written = increment.recompute(
        affected, build, SCORED_STEPS, ["quality_score", "quality_reasons"]
    )
    summary = written.summary
    context.log.info("%d steps scored", summary.height)
    reasons = summary.select(
        pl.col("quality_reasons").explode(empty_as_null=False).alias("reason")
    ).drop_nulls()
    return Refreshed(
        written.table,
        summary.height,
        metadata={
            "sample": sample(
                written.head,
                [
                    "trajectory_id",
                    "step_index",
                    "quality_score",
                    "quality_reasons",
                    "response_text",
                ],
                turns,
            ),
            "quality_distribution": histogram(summary.get_column("quality_score")),
            "quality_reasons": dg.MetadataValue.json(counts(reasons, "reason")),
        },
    )


@incremental_asset(
    "curated_steps", sources=["scored_steps", "labels"], schema=CURATED_STEPS, group="curation"
)
def curated_steps(context: dg.AssetExecutionContext, increment: Increment) -> Refreshed:
    """Scored steps with human labels applied (latest wins): label, trainable flag, tags.

    A new label re-curates only the trajectory it targets; batches read this table.
    """
    rescored = increment.new_rows("scored_steps", ["trajectory_id"])
    labelled = _labelled_trajectories(increment, increment.new_rows("labels"))
    affected = trajectory_ids(rescored, labelled)

    def build(keys: pl.Series) -> pl.DataFrame:
        scored = increment.rows_where("scored_steps", "trajectory_id", keys)
        targets = pl.concat([keys, scored.get_column("turn_id")])
        return curate_steps(scored, increment.rows_where("labels", "target_id", targets)).collect()

    written = increment.recompute(affected, build, CURATED_STEPS, ["trainable", "quality_label"])
    summary = written.summary
    context.log.info("%d steps curated", summary.height)
    return Refreshed(
        written.table,
        summary.height,
        metadata={
            "sample": sample(
                written.head,
                [
                    "trajectory_id",
                    "step_index",
                    "trainable",
                    "quality_label",
                    "reward",
                    "response_text",
                ],
                increment.lake.scan("turns"),
            ),
            "trainable_share": float(summary["trainable"].mean()) if summary.height else None,
            "quality_labels": dg.MetadataValue.json(counts(summary, "quality_label")),
        },
    )


def _labelled_trajectories(increment: Increment, labels: pl.DataFrame | None) -> pl.DataFrame:
    """Trajectories that new labels touch (step labels resolve through their turn_id)."""
    if labels is None or increment.upto["scored_steps"] is None:
        return empty(CURATED_STEPS).select("trajectory_id")
    by_trajectory = labels.filter(pl.col("target_kind") == "trajectory").select(
        pl.col("target_id").alias("trajectory_id")
    )
    step_targets = labels.filter(pl.col("target_kind") == "step").get_column("target_id")
    by_step = (
        increment.scan("scored_steps")
        .filter(pl.col("turn_id").is_in(step_targets.to_list()))
        .select("trajectory_id")
        .collect()
    )
    return pl.concat([by_trajectory, by_step])
