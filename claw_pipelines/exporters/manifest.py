"""Write a batch under a directory in the recipe's export formats, described by manifest.json."""

from __future__ import annotations

from typing import Any

import polars as pl
from pydantic import BaseModel

from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.jsonl import write_jsonl
from claw_pipelines.exporters.trl import write_trl
from claw_pipelines.exporters.verl import write_verl
from claw_pipelines.recipes import Recipe

MANIFEST = "manifest.json"
"""Written last, so a batch whose folder has it was exported in full."""


class ExportedFile(BaseModel):
    path: str
    format: str
    rows: int
    description: str


class Manifest(BaseModel):
    recipe: str
    algorithm: str
    batch_id: str
    rows: int
    source_versions: dict[str, int]
    planned_with: dict[str, Any] | None = None
    """The batch's reservation record (every input version, read start, plan time and recipe):
    with the lake at hand, enough to plan the batch again."""
    files: list[ExportedFile]


def export_batch(
    recipe: Recipe,
    rows: pl.DataFrame,
    out: Destination,
    *,
    source_versions: dict[str, int] | None = None,
    planned_with: dict[str, Any] | None = None,
    pad_token_id: int = 0,
) -> Manifest:
    """Write ``rows`` (one batch) for each of ``recipe.exports`` under ``out``; return and write
    ``manifest.json``.

    Rows are put in (group, trajectory, step) order first, so exporting the same batch twice
    writes the same files. verl needs per-step token rows and is skipped for dpo pairs.
    """
    batch_ids = rows["batch_id"].unique().to_list()
    if len(batch_ids) != 1:
        raise ValueError(f"export_batch takes the rows of exactly one batch, got {batch_ids}")
    dpo = recipe.algorithm == "dpo"
    rows = rows.sort(
        *(["group_id", "turn_id"] if dpo else ["group_id", "trajectory_id", "step_index"])
    )
    files: list[ExportedFile] = []
    if "verl" in recipe.exports and not dpo:
        for path, description in write_verl(rows, out, pad_token_id=pad_token_id):
            files.append(
                ExportedFile(path=path, format="verl", rows=rows.height, description=description)
            )
    if "trl" in recipe.exports:
        for path, description, count in write_trl(recipe.algorithm, rows, out):
            files.append(ExportedFile(path=path, format="trl", rows=count, description=description))
    if "jsonl" in recipe.exports:
        for path, description, count in write_jsonl(recipe.algorithm, rows, out):
            files.append(
                ExportedFile(path=path, format="jsonl", rows=count, description=description)
            )
    manifest = Manifest(
        recipe=recipe.name,
        algorithm=recipe.algorithm,
        batch_id=batch_ids[0],
        rows=rows.height,
        source_versions=source_versions or {},
        planned_with=planned_with,
        files=files,
    )
    out.text(manifest.model_dump_json(indent=2), MANIFEST)
    return manifest
