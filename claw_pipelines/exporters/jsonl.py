"""JSON Lines exports: one object per batch row, and one per trajectory (OpenRLHF-style)."""

from __future__ import annotations

import polars as pl

from claw_pipelines.exporters.destination import Destination

_STEP_FIELDS = ["step_index", "turn_id", "prompt_token_ids", "response_token_ids",
                "response_logprobs", "reward", "policy_version", "finish_reason"]  # fmt: skip


def trajectories(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per trajectory: its steps in order (each with its credited reward) and
    ``reward``, the trajectory's outcome. Not the sum of the credited rewards: broadcast or
    discounted credit counts the outcome once per step, so a sum would grow with the steps."""
    return (
        rows.sort("trajectory_id", "step_index")
        .group_by("trajectory_id", maintain_order=True)
        .agg(
            pl.col("group_id").first(),
            pl.struct(_STEP_FIELDS).alias("steps"),
            pl.col("outcome_reward").first().alias("reward"),
        )
    )


def write_jsonl(algorithm: str, rows: pl.DataFrame, out: Destination) -> list[tuple[str, str, int]]:
    if algorithm == "dpo":
        out.ndjson(rows, "jsonl/pairs.jsonl")
        return [("jsonl/pairs.jsonl", "one preference pair per line", rows.height)]
    out.ndjson(rows, "jsonl/steps.jsonl")
    per_trajectory = trajectories(rows)
    out.ndjson(per_trajectory, "jsonl/trajectories.jsonl")
    return [
        ("jsonl/steps.jsonl", "one batch row (step) per line", rows.height),
        (
            "jsonl/trajectories.jsonl",
            "one trajectory per line, steps in order",
            per_trajectory.height,
        ),
    ]
