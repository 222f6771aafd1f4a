"""Quality scoring of rewarded steps: a score in [0, 1] and the reasons that lowered it."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from pydantic import BaseModel


class QualityConfig(BaseModel):
    """Signal weights and thresholds (assets/quality.yaml). A step's score is
    ``max(0, 1 - sum(weights of the signals it trips))``."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> QualityConfig:
        raise NotImplementedError


def score_steps(
    rewarded: pl.LazyFrame | pl.DataFrame,
    config: QualityConfig,
    *,
    latest_policy_version: int | None = None,
) -> pl.LazyFrame:
    """``derived_schemas.SCORED_STEPS`` rows: adds ``quality_score`` and ``quality_reasons``.

    Staleness is measured against ``latest_policy_version`` (default: the max in ``rewarded``).
    """
    raise NotImplementedError
