"""Incremental step extraction: new turns + carried-over open turns + new events -> closed steps.

Work grows with what is new, not with the table: each run reads the turns and trajectory events
landed since its watermark plus its own small state (``steps_open``: turns of still-open
trajectories and the tails of recently closed ones) and emits the steps of every trajectory that
closed in this run.

Rules:
- A trajectory closes on a completed/aborted event, or when idle (no turn ended within
  ``idle_timeout_s`` before ``now``) -> ``close_reason`` completed | aborted | timeout.
- Turns are ordered by (started_at, turn_id) whatever order they arrived in; duplicate turn_ids
  keep their first delivery.
- Reopened trajectories: an emitted trajectory keeps a ``closed`` tail in the state for
  ``reopen_window_s``. Turns that arrive for it later are emitted at once as extra steps
  (``reopened = true``) numbered after the last emitted step and prefix-checked against it;
  steps already emitted are never re-emitted or renumbered (the steps table stays append-only;
  ``is_last`` is "last at emission", readers take max(step_index) per trajectory as the end).
  Re-delivered turn_ids of an emitted trajectory are dropped. After the window a late turn
  starts a new emission with step_index 0 of the same trajectory_id.
- An event for a trajectory with no turns yet leaves a closed tail with step_index -1, so turns
  that land after their completion event are emitted as soon as they arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl


@dataclass(frozen=True)
class StepExtraction:
    """One run's result: steps to append, and the state that replaces ``steps_open``."""

    steps: pl.DataFrame
    """Rows in ``derived_schemas.STEPS``."""
    open_state: pl.DataFrame
    """Rows in ``derived_schemas.OPEN_STATE``."""


def extract_steps(
    new_turns: pl.LazyFrame | pl.DataFrame | None,
    open_state: pl.LazyFrame | pl.DataFrame | None,
    new_events: pl.LazyFrame | pl.DataFrame | None,
    *,
    now: datetime,
    source_version: int | None = None,
    idle_timeout_s: float = 600.0,
    reopen_window_s: float = 86_400.0,
    prefix_key_tokens: int = 16,
) -> StepExtraction:
    """Close trajectories and emit their steps.

    ``new_turns``: turns rows (CDF since the watermark; a ``_commit_version`` column, if present,
    becomes the row's ``source_version``, else ``source_version`` is used). ``open_state``: the
    previous run's ``steps_open`` (None on the first run). ``new_events``: trajectory_events
    rows since their watermark. Turns without a trajectory_id are assigned to inferred
    trajectories by token prefix (see ``claw_pipelines.transforms.inference``).
    """
    raise NotImplementedError
