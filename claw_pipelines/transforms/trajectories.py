"""Per-trajectory summary rows, recomputed from all steps of the trajectories that changed."""

from __future__ import annotations

import polars as pl


def summarize_trajectories(
    steps: pl.LazyFrame | pl.DataFrame, events: pl.LazyFrame | pl.DataFrame | None = None
) -> pl.LazyFrame:
    """One ``derived_schemas.TRAJECTORIES`` row per trajectory in ``steps``.

    Pass every step of the affected trajectories (reopened ones included) and their
    trajectory_events: ``outcome`` is the latest completed/aborted event (else the steps'
    close_reason), ``outcome_reward`` the latest event reward, ``complete`` = outcome completed.
    ``shared_prefix_tokens_saved`` sums each step's prefix shared with the previous step's full
    sequence (what a prefix-tree merge of the trajectory saves).
    """
    raise NotImplementedError
