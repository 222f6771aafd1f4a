"""JSON Lines exports: one object per batch row, and one per trajectory (OpenRLHF-style)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

_STEP_FIELDS = ["step_index", "turn_id", "prompt_token_ids", "response_token_ids",
                "response_logprobs", "reward", "policy_version"]  # fmt: skip


def trajectories(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per trajectory: its steps in order, total and outcome reward."""
    return (
        rows.sort("trajectory_id", "step_index")
        .group_by("trajectory_id", maintain_order=True)
        .agg(
            pl.col("group_id").first(),
            pl.struct(_STEP_FIELDS).alias("steps"),
            pl.col("reward").sum().alias("reward"),
            pl.col("outcome_reward").first(),
        )
    )


def write_jsonl(algorithm: str, rows: pl.DataFrame, out_dir: Path) -> list[tuple[str, str, int]]:
    target = out_dir / "jsonl"
    target.mkdir(parents=True, exist_ok=True)
    if algorithm == "dpo":
        rows.write_ndjson(target / "pairs.jsonl")
        return [("jsonl/pairs.jsonl", "one preference pair per line", rows.height)]
    rows.write_ndjson(target / "steps.jsonl")
    per_trajectory = trajectories(rows)
    per_trajectory.write_ndjson(target / "trajectories.jsonl")
    return [
        ("jsonl/steps.jsonl", "one batch row (step) per line", rows.height),
        (
            "jsonl/trajectories.jsonl",
            "one trajectory per line, steps in order",
            per_trajectory.height,
        ),
    ]
