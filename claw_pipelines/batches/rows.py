"""A stored batch's rows in export order: the order every export file has, shared by the
exporters (which write it) and trainers (``trainer.Batch``, which read it back)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import polars as pl

from claw_pipelines.batches.names import batches_table
from claw_pipelines.derived_schemas import BATCH_ROWS, TURN_COLUMNS, fit, with_turn_columns
from claw_pipelines.lake import Lake
from claw_pipelines.transforms.landed_turns import chunks_with_turn_columns
from claw_pipelines.transforms.sequences import is_sequence, sequence_rows

EXPORT_ORDER = {
    "dpo": ["group_id", "turn_id"],
    "steps": ["group_id", "trajectory_id", "step_index"],
    "sequences": ["group_id", "trajectory_id", "segment_index"],
}

CHUNK_ROWS = 16_384
"""Batch rows per export chunk (``completed_chunks``): an export holds about two chunks of
token lists in memory, the one it writes and the one being read."""


def in_export_order(algorithm: str, rows: pl.DataFrame) -> pl.DataFrame:
    """A batch's rows in (group, trajectory, step or segment) order (pairs: group, turn), the
    order of every export file, so exporting the same batch twice writes the same files."""
    kind = "sequences" if is_sequence(rows) else "steps"
    keys = EXPORT_ORDER["dpo" if algorithm == "dpo" else kind]
    order = rows.select(pl.arg_sort_by(keys)).to_series()
    if order.equals(pl.int_range(rows.height, dtype=order.dtype, eager=True)):
        return rows  # already in order: no copy of the token lists
    return rows[order]


def complete_rows(stored: pl.DataFrame, turns: pl.LazyFrame | pl.DataFrame | None) -> pl.DataFrame:
    """A batch's rows as ``batches/<recipe>`` stores them, completed: grpo-style rows get
    their ``TURN_COLUMNS`` from ``turns`` (``BATCH_ROWS``), in the order they came;
    ``turns`` None: complete already (dpo pairs)."""
    if turns is None:
        return stored
    return fit(with_turn_columns(stored, turns), BATCH_ROWS)


def stored_rows(lake: Lake, recipe: str, algorithm: str, batch_id: str) -> pl.DataFrame:
    """The rows of ``batch_id`` as ``batches/<recipe>`` stores them, in export order (empty
    when it has none): grpo-style rows point at their turns, dpo pairs are complete."""
    scan = lake.scan(batches_table(recipe))
    if scan is None:
        return pl.DataFrame()
    return in_export_order(algorithm, scan.filter(pl.col("batch_id") == batch_id).collect())


def batch_rows(
    lake: Lake, recipe: str, algorithm: str, batch_id: str, layout: str = "step"
) -> pl.DataFrame:
    """The rows of ``batch_id`` as exporters and trainers take them, in export order (empty
    when it has none): grpo-style rows get their token lists and messages from ``turns`` here
    (read in landing order, so token lists landed in that order are taken as read, not
    gathered), in the ``sequence`` layout one row per segment (``transforms.sequences``);
    dpo pairs are stored complete."""
    stored = stored_rows(lake, recipe, algorithm, batch_id)
    if algorithm == "dpo" or stored.is_empty():
        return stored
    stored = stored.drop(TURN_COLUMNS, strict=False)
    if layout == "sequence":
        return in_export_order(algorithm, sequence_rows(stored, lake.scan_landed("turns")))
    return complete_rows(stored, lake.scan_landed("turns"))


def completed_chunks(
    lake: Lake, algorithm: str, stored: pl.DataFrame, layout: str = "step"
) -> Iterator[pl.DataFrame]:
    """``stored`` rows of one batch (``stored_rows``) as ``batch_rows`` completes them, in
    chunks of about ``CHUNK_ROWS`` steps that hold whole groups (whole trajectories where rows
    have no group), reading ``turns`` once (``landed_turns``); in the ``sequence`` layout a
    chunk's sequences read only their segments' last prompts (``transforms.sequences``)."""
    if algorithm == "dpo" or stored.is_empty():
        if not stored.is_empty():
            yield stored
        return
    unit = pl.coalesce("group_id", "trajectory_id")
    begins = stored.select((unit != unit.shift()).fill_null(True)).to_series().to_numpy()
    if layout == "sequence":
        turns = lake.scan_landed("turns")
        starts = [*np.flatnonzero(begins), stored.height]
        begin = 0
        for end in starts[1:]:
            if end - begin >= CHUNK_ROWS or end == stored.height:
                yield sequence_rows(stored.slice(begin, end - begin), turns)
                begin = end
        return
    for chunk in chunks_with_turn_columns(
        stored.drop(TURN_COLUMNS, strict=False),
        lake.open("turns"),
        TURN_COLUMNS,
        chunk_starts=np.flatnonzero(begins),
        chunk_rows=CHUNK_ROWS,
    ):
        yield fit(chunk, BATCH_ROWS)
