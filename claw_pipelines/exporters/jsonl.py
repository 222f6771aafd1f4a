"""JSON Lines exports: one object per batch row (a sequence or a step, by the recipe's layout),
and one per trajectory (OpenRLHF-style)."""

from __future__ import annotations

from functools import partial

import polars as pl

from claw_pipelines.exporters.chunked_files import ChunkedFiles
from claw_pipelines.exporters.destination import Destination
from claw_pipelines.transforms.sequences import is_sequence

_STEP_FIELDS = ["step_index", "turn_id", "prompt_token_ids", "response_token_ids",
                "response_logprobs", "reward", "policy_version", "finish_reason"]  # fmt: skip
_SEQUENCE_FIELDS = ["segment_index", "break_reason", "turn_ids", "prompt_token_ids",
                    "response_token_ids", "response_mask", "response_logprobs", "spans", "reward",
                    "policy_version", "finish_reason"]  # fmt: skip


def trajectories(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per trajectory of ``rows`` (in export order: each trajectory's rows together,
    in order), in that order: its steps (each with its credited reward) or, in the sequence
    layout, its ``sequences``, and ``reward``, the trajectory's outcome. Not the sum of the
    credited rewards: broadcast or discounted credit counts the outcome once per step, so a sum
    would grow with the steps."""
    parts = (
        pl.struct(_SEQUENCE_FIELDS).alias("sequences")
        if is_sequence(rows)
        else pl.struct(_STEP_FIELDS).alias("steps")
    )
    return rows.group_by("trajectory_id", maintain_order=True).agg(
        pl.col("group_id").first(),
        parts,
        pl.col("outcome_reward").first().alias("reward"),
        pl.col("model").last().alias("tokenizer"),
    )


class JsonlFiles(ChunkedFiles):
    """A batch's JSON lines files, appended a chunk of rows at a time (each chunk holds whole
    trajectories, in export order)."""

    def __init__(self, algorithm: str, out: Destination) -> None:
        super().__init__()
        self.algorithm, self.out = algorithm, out

    def write(self, rows: pl.DataFrame) -> None:
        if self.algorithm == "dpo":
            self._append("jsonl/pairs.jsonl", rows, "one preference pair per line")
            return
        if is_sequence(rows):
            self._append("jsonl/sequences.jsonl", rows, "one batch row (sequence) per line")
        else:
            self._append("jsonl/steps.jsonl", rows, "one batch row (step) per line")
        self._append(
            "jsonl/trajectories.jsonl",
            trajectories(rows),
            "one trajectory per line, steps in order",
        )

    def _append(self, path: str, frame: pl.DataFrame, description: str) -> None:
        file = self._opened(path, description, partial(self.out.stream, path))
        if frame.height:
            frame.write_ndjson(file.handle)
        file.rows += frame.height
