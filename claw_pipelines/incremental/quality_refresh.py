"""Runs of the ``scored_steps`` and ``curated_steps`` tables: the last steps before a step can
enter a batch. Each recomputes only the trajectories its new rows touch and replaces their
rows."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from claw_pipelines.derived_schemas import CURATED_STEPS, SCORED_STEPS
from claw_pipelines.incremental.increment import Increment, Written, trajectory_ids
from claw_pipelines.policy.versions import highest_announced_version, lag_reference
from claw_pipelines.transforms.curation import curate_steps, labelled_trajectories
from claw_pipelines.transforms.quality import QualityConfig, score_steps


@dataclass
class Scored:
    """What a scored_steps run wrote, and the ``turns`` it read token lists from (a sample
    shows their texts)."""

    written: Written
    turns: pl.LazyFrame


def refresh_scored_steps(increment: Increment, config: QualityConfig) -> Scored:
    """Score the steps of every trajectory re-credited upstream, with the signals and weights
    of ``config``. Token signals come from what the step extractor stored
    (``SIGNAL_COLUMNS``), or else from the rows' token lists read from ``turns``."""
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
            config,
            latest_policy_version=latest_policy,
        ).collect()

    written = increment.recompute(
        affected, build, SCORED_STEPS, ["quality_score", "quality_reasons"]
    )
    return Scored(written, turns)


def refresh_curated_steps(increment: Increment) -> Written:
    """Apply the human labels (latest wins) to the steps of every trajectory re-scored or
    newly labelled: a new label re-curates only the trajectory it targets."""
    rescored = increment.new_rows("scored_steps", ["trajectory_id"])
    labels = increment.new_rows("labels")
    scored = None if labels is None else increment.scan("scored_steps")  # a scan costs ms
    labelled = labelled_trajectories(labels, scored)
    affected = trajectory_ids(rescored, labelled)

    def build(keys: pl.Series) -> pl.DataFrame:
        scored = increment.rows_where("scored_steps", "trajectory_id", keys)
        targets = pl.concat([keys, scored.get_column("turn_id")])
        return curate_steps(scored, increment.rows_where("labels", "target_id", targets)).collect()

    return increment.recompute(affected, build, CURATED_STEPS, ["trainable", "quality_label"])
