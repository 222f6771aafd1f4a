"""Where a recipe's batches live in the lake: one place for the names the batch assets write and
trainers read (``claw_pipelines.trainer``), so neither guesses the other's layout, and for
reading a batch's rows back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from claw_pipelines.lake import Lake

MANIFEST = "manifest.json"
"""Written last by an export, so a batch whose folder has it was exported in full."""


def ledger_table(recipe: str) -> str:
    """One row per step a batch of ``recipe`` reserved (the at-most-once guarantee)."""
    return f"batch_ledger/{recipe}"


def batches_table(recipe: str) -> str:
    """The framework-neutral rows of every batch of ``recipe``."""
    return f"batches/{recipe}"


def exports_folder(recipe: str) -> str:
    return f"exports/{recipe}"


def manifest_path(recipe: str, batch_id: str) -> str:
    return f"{exports_folder(recipe)}/{batch_id}/{MANIFEST}"


def consumption_table(recipe: str) -> str:
    """One row per batch a trainer (a named consumer) said it trained on."""
    return f"batch_consumption/{recipe}"


CHUNK_ROWS = 16_384
"""Batch rows per export chunk (``completed_chunks``): an export holds about two chunks of
token lists in memory, the one it writes and the one being read."""


def stored_rows(lake: Lake, recipe: str, algorithm: str, batch_id: str) -> pl.DataFrame:
    """The rows of ``batch_id`` as ``batches/<recipe>`` stores them, in export order (empty
    when it has none): grpo-style rows point at their turns, dpo pairs are complete."""
    from claw_pipelines.exporters.manifest import in_export_order

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
    from claw_pipelines.batching.planner import complete_rows
    from claw_pipelines.derived_schemas import TURN_COLUMNS
    from claw_pipelines.transforms.sequences import sequence_rows

    stored = stored_rows(lake, recipe, algorithm, batch_id)
    if algorithm == "dpo" or stored.is_empty():
        return stored
    stored = stored.drop(TURN_COLUMNS, strict=False)
    if layout == "sequence":
        return sequence_rows(stored, lake.scan_landed("turns"))
    return complete_rows(stored, lake.scan_landed("turns"))


def completed_chunks(
    lake: Lake, algorithm: str, stored: pl.DataFrame, layout: str = "step"
) -> Iterator[pl.DataFrame]:
    """``stored`` rows of one batch (``stored_rows``) as ``batch_rows`` completes them, in
    chunks of about ``CHUNK_ROWS`` steps that hold whole groups (whole trajectories where rows
    have no group), reading ``turns`` once (``landed_turns``); in the ``sequence`` layout a
    chunk's sequences read only their segments' last prompts (``transforms.sequences``)."""
    from claw_pipelines.derived_schemas import BATCH_ROWS, TURN_COLUMNS, fit
    from claw_pipelines.landed_turns import chunks_with_turn_columns
    from claw_pipelines.transforms.sequences import sequence_rows

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
