"""What every commit of spooled rows follows, whoever makes it (a proxy's own flusher, or the
fleet's committer of staged segments): the order of the tables, one row per key, the size of a
commit, and background steps that log their failures and leave the rows spooled."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from claw_pipelines.schemas import LANDING_MODELS

log = logging.getLogger(__name__)
Item = TypeVar("Item")

SEGMENT_BYTES = 64 * 1024 * 1024
"""A flush is asked for once the active segments hold this much (and a commit takes at most
this much), so large rows never pile up in memory."""

COMMIT_ORDER = sorted(LANDING_MODELS, key=lambda table: LANDING_MODELS[table].closes)
"""The order a flush commits the tables in: those whose rows close something last."""


def dedupe_on_key(data: pa.Table, key: str) -> pa.Table:
    """Keep the first row per key: a replayed or repeated row must not land twice."""
    if data.num_rows < 2 or pc.count_distinct(data.column(key)).as_py() == data.num_rows:
        return data
    indices = pa.table({key: data.column(key), "_i": pa.array(range(data.num_rows))})
    first = indices.group_by(key, use_threads=False).aggregate([("_i", "min")]).column("_i_min")
    return data.take(pc.take(first, pc.sort_indices(first)))


def log_failure(action: Callable[[], object], what: str) -> None:
    """Run a background step; a failure is logged and its rows stay spooled for a later try."""
    try:
        action()
    except Exception:
        log.exception("%s failed; spooled rows stay on disk and are retried", what)


def runs_of_bytes(
    items: list[Item], size: Callable[[Item], int], max_bytes: int
) -> list[list[Item]]:
    """Consecutive runs of ``items`` of at most ``max_bytes`` (at least one item each), so a
    backlog of large rows is committed in pieces instead of read into memory whole."""
    runs: list[list[Item]] = [[]]
    total = 0
    for item in items:
        length = size(item)
        if runs[-1] and total + length > max_bytes:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += length
    return [run for run in runs if run]
