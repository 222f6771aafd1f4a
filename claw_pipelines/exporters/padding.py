"""Ragged token lists to padded numpy matrices, vectorised (no per-row Python loop)."""

from __future__ import annotations

import numpy as np
import polars as pl


def lengths(lists: pl.Series) -> np.ndarray:
    return lists.list.len().fill_null(0).to_numpy().astype(np.int64)


def pad(lists: pl.Series, width: int, value: float, dtype: np.dtype, *, left: bool) -> np.ndarray:
    """[rows, width] matrix: each list placed left- or right-aligned, the rest ``value``.

    Every list must fit in ``width`` (batches never truncate silently: the planner's length
    filters decide what fits).
    """
    sizes = lengths(lists)
    if sizes.size and sizes.max() > width:
        raise ValueError(f"a sequence of {sizes.max()} tokens does not fit width {width}")
    out = np.full((len(sizes), width), value, dtype=dtype)
    flat = lists.list.explode(keep_nulls=False, empty_as_null=False).to_numpy()
    rows = np.repeat(np.arange(len(sizes)), sizes)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    cols = np.arange(len(flat)) - starts
    if left:
        cols = cols + (width - sizes)[rows]
    out[rows, cols] = flat
    return out


def right_mask(sizes: np.ndarray, width: int) -> np.ndarray:
    """1 on the first ``size`` columns of each row (right-padded sequences)."""
    return (np.arange(width)[None, :] < sizes[:, None]).astype(np.int64)


def left_mask(sizes: np.ndarray, width: int) -> np.ndarray:
    """1 on the last ``size`` columns of each row (left-padded sequences)."""
    return (np.arange(width)[None, :] >= (width - sizes)[:, None]).astype(np.int64)
