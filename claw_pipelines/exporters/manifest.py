"""Write a batch under a directory in the recipe's export formats, described by manifest.json."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from pydantic import BaseModel

from claw_pipelines.recipes import Recipe


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
    files: list[ExportedFile]


def export_batch(
    recipe: Recipe,
    rows: pl.DataFrame,
    out_dir: str | Path,
    *,
    source_versions: dict[str, int] | None = None,
    pad_token_id: int = 0,
) -> Manifest:
    """Write ``rows`` (one batch) for each of ``recipe.exports`` under ``out_dir``; return and
    write ``manifest.json``."""
    raise NotImplementedError
