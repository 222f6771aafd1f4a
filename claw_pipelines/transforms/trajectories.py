"""Per-trajectory summary rows, recomputed from all steps of the trajectories that changed."""

from __future__ import annotations

import polars as pl

from claw_pipelines.derived_schemas import TRAJECTORIES
from claw_pipelines.schemas import polars_schema

SUMMARIZED_COLUMNS = [
    "trajectory_id", "step_index", "group_id", "channel", "agent", "prompt_len", "response_len",
    "started_at", "ended_at", "close_reason", "policy_version", "shared_prefix_tokens",
    "trajectory_inferred", "prefix_consistent", "parent_trajectory_id",
]  # fmt: skip
"""The step columns a summary reads: a reader of ``steps`` reads only these (the messages and
ids are most of a step's bytes), and they are selected before the sort, as polars does not push
the projection below a sort of an in-memory frame (100k steps: 18 CPU ms against 27)."""

EVENT_COLUMNS = ["trajectory_id", "event", "reward", "created_at", "event_id"]
"""The trajectory_events columns ``latest_events`` reads."""


def latest_events(events: pl.LazyFrame | pl.DataFrame | None) -> pl.LazyFrame:
    """Per trajectory: the latest lifecycle event and the latest reward an event carried."""
    schema = {"trajectory_id": pl.String, "event": pl.String, "event_reward": pl.Float64}
    if events is None:
        return pl.LazyFrame(schema=schema)
    return (
        events.lazy()
        .select(EVENT_COLUMNS)
        .sort("created_at", "event_id")
        .group_by("trajectory_id")
        .agg(
            pl.col("event").last(),
            pl.col("reward").drop_nulls().last().alias("event_reward"),
        )
    )


def summarize_trajectories(
    steps: pl.LazyFrame | pl.DataFrame, events: pl.LazyFrame | pl.DataFrame | None = None
) -> pl.LazyFrame:
    """One ``derived_schemas.TRAJECTORIES`` row per trajectory in ``steps``.

    Pass every step of the affected trajectories (reopened ones included) and their
    trajectory_events: ``outcome`` is the latest completed/aborted event (else the steps'
    close_reason), ``outcome_reward`` the latest event reward, ``complete`` = outcome completed.
    ``shared_prefix_tokens_saved`` sums each step's prefix shared with the previous step's full
    sequence (what a prefix-tree merge of the trajectory saves). A side trajectory has no events
    of its own (its parent's events name the parent), so its outcome is its close_reason.
    """
    ordered = steps.lazy().select(SUMMARIZED_COLUMNS).sort("trajectory_id", "step_index")
    summary = ordered.group_by("trajectory_id").agg(
        pl.col("group_id").drop_nulls().first(),
        pl.col("channel").drop_nulls().first(),
        pl.col("agent").drop_nulls().first(),
        pl.len().alias("num_steps"),
        pl.col("prompt_len").sum().alias("prompt_tokens"),
        pl.col("response_len").sum().alias("response_tokens"),
        pl.col("started_at").min(),
        pl.col("ended_at").max(),
        pl.col("close_reason").last(),
        pl.col("policy_version").min().alias("_lowest"),
        pl.col("policy_version").max().alias("_highest"),
        pl.col("shared_prefix_tokens").sum().alias("shared_prefix_tokens_saved"),
        pl.col("trajectory_inferred").all(),
        pl.col("prefix_consistent").all(),
        pl.col("parent_trajectory_id").drop_nulls().first(),
    )
    outcome = pl.coalesce("event", "close_reason")
    return (
        _with_policy_versions(summary, ordered)
        .join(latest_events(events), on="trajectory_id", how="left")
        .with_columns(
            ((pl.col("ended_at") - pl.col("started_at")).dt.total_microseconds() / 1e6).alias(
                "duration_s"
            ),
            outcome.alias("outcome"),
            (outcome == "completed").alias("complete"),
            pl.col("event_reward").alias("outcome_reward"),
        )
        .select(pl.col(name).cast(dtype) for name, dtype in polars_schema(TRAJECTORIES).items())
        .sort("trajectory_id")
    )


def _with_policy_versions(summary: pl.LazyFrame, steps: pl.LazyFrame) -> pl.LazyFrame:
    """``summary`` (with each trajectory's ``_lowest`` and ``_highest`` policy_version) plus
    ``policy_versions``, its distinct versions in order. A trajectory that ran on one version
    gets a list made from its bounds; only those with several are grouped into lists (for every
    trajectory that took ~50 ms per 100k steps)."""
    lowest, highest = pl.col("_lowest"), pl.col("_highest")
    several = (
        steps.join(summary.filter(lowest != highest), on="trajectory_id", how="semi")
        .group_by("trajectory_id")
        .agg(pl.col("policy_version").drop_nulls().unique().sort().alias("_several"))
    )
    one = lowest.reshape((-1, 1)).arr.to_list()
    versions = (
        pl.when(lowest == highest)
        .then(one)
        .otherwise(pl.coalesce("_several", pl.lit([], pl.List(pl.Int64))))
    )
    return (
        summary.join(several, on="trajectory_id", how="left")
        .with_columns(versions.alias("policy_versions"))
        .drop("_lowest", "_highest", "_several")
    )
