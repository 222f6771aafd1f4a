"""Apply human labels to scored steps."""

from __future__ import annotations

import polars as pl


def curate_steps(
    scored: pl.LazyFrame | pl.DataFrame, labels: pl.LazyFrame | pl.DataFrame | None
) -> pl.LazyFrame:
    """``CURATED_STEPS`` rows: quality_label, trainable (default true), tags, label_note.

    Per target the latest label wins (created_at, then label_id); a step label overrides its
    trajectory's label field by field (fields the step label leaves null fall back).
    """
    raise NotImplementedError
