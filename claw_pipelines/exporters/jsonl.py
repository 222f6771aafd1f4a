"""JSON Lines exports: one object per batch row, and one per trajectory (OpenRLHF-style)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from claw_pipelines.exporters.destination import Destination

_STEP_FIELDS = ["step_index", "turn_id", "prompt_token_ids", "response_token_ids",
                "response_logprobs", "reward", "policy_version", "finish_reason"]  # fmt: skip


def trajectories(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per trajectory of ``rows`` (in export order: each trajectory's steps together,
    in step order), in that order: its steps (each with its credited reward) and ``reward``,
    the trajectory's outcome. Not the sum of the credited rewards: broadcast or discounted
    credit counts the outcome once per step, so a sum would grow with the steps."""
    return rows.group_by("trajectory_id", maintain_order=True).agg(
        pl.col("group_id").first(),
        pl.struct(_STEP_FIELDS).alias("steps"),
        pl.col("outcome_reward").first().alias("reward"),
    )


class JsonlFiles:
    """A batch's JSON lines files, appended a chunk of rows at a time (each chunk holds whole
    trajectories, in export order); a context manager that closes them."""

    def __init__(self, algorithm: str, out: Destination) -> None:
        self.algorithm, self.out = algorithm, out
        self._open: dict[str, tuple[pa.NativeFile, str]] = {}
        self._rows: dict[str, int] = {}

    def write(self, rows: pl.DataFrame) -> None:
        if self.algorithm == "dpo":
            self._append("jsonl/pairs.jsonl", rows, "one preference pair per line")
            return
        self._append("jsonl/steps.jsonl", rows, "one batch row (step) per line")
        self._append(
            "jsonl/trajectories.jsonl",
            trajectories(rows),
            "one trajectory per line, steps in order",
        )

    def _append(self, name: str, frame: pl.DataFrame, description: str) -> None:
        if name not in self._open:
            self._open[name] = (self.out.stream(name), description)
            self._rows[name] = 0
        if frame.height:
            self._open[name][0].write(frame.write_ndjson().encode())
        self._rows[name] += frame.height

    def finish(self) -> list[tuple[str, str, int]]:
        """Close the files; (path, description, rows) of each."""
        self.close()
        return [(name, description, self._rows[name])
                for name, (_, description) in self._open.items()]  # fmt: skip

    def close(self) -> None:
        for stream, _ in self._open.values():
            if not stream.closed:
                stream.close()

    def __enter__(self) -> JsonlFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
