"""Quality scoring and human curation: the last steps before a step can enter a batch."""

import dagster as dg
import polars as pl

from assets.incremental import Refreshed, incremental_asset
from assets.metadata import counts, histogram, sample
from claw_pipelines.config_files import quality_config
from claw_pipelines.derived_schemas import CURATED_STEPS, SCORED_STEPS
from claw_pipelines.incremental.increment import Increment
from claw_pipelines.incremental.quality_refresh import refresh_curated_steps, refresh_scored_steps


@incremental_asset("scored_steps", sources=["rewarded_steps"], schema=SCORED_STEPS, group="quality")
def scored_steps(context: dg.AssetExecutionContext, increment: Increment) -> Refreshed:
    """A quality score in [0, 1] per step and the reasons that lowered it.

    Signals and weights come from assets/quality.yaml; trajectories re-credited upstream are
    re-scored and their rows replaced. Token signals come from what the step extractor stored
    (``SIGNAL_COLUMNS``), or else from the rows' token lists read from ``turns``.
    """
    run = refresh_scored_steps(increment, quality_config())
    written = run.written
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
                run.turns,
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
    written = refresh_curated_steps(increment)
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
