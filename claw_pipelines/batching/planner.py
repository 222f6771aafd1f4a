"""Batch planning: the next batches of a recipe, their drops and the drops that are final.

``plan_batches`` is pure: from curated steps and the recipe's consumption ledger it picks the
next batches deterministically, so re-planning from pinned input versions (and the batch's
position among those planned together) reproduces the same batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

import polars as pl

from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batches.rows import complete_rows
from claw_pipelines.batching.units import Units, dpo_batches, trajectory_batches
from claw_pipelines.derived_schemas import (
    DPO_PAIRS,
    DROPPED,
    LEDGER,
    STORED_BATCH_ROWS,
    fit,
)
from claw_pipelines.lake.filters import floor_ms, keyed, since
from claw_pipelines.transforms.credit import assign_credit
from claw_pipelines.transforms.sequences import segment_index, sequence_lengths


@dataclass(frozen=True)
class BatchPlan:
    batch_id: str
    planned: pl.DataFrame
    """What ``batches/<recipe>`` stores of the batch, in deterministic order:
    ``derived_schemas.STORED_BATCH_ROWS`` (rows pointing at their turns), for dpo complete
    ``DPO_PAIRS`` rows."""
    turns: pl.LazyFrame | pl.DataFrame | None
    """The turns the rows' ``TURN_COLUMNS`` are read from (None when ``planned`` is complete)."""
    dropped: pl.DataFrame
    """``derived_schemas.DROPPED``: unconsumed steps left out of this batch, with the reason
    (filters, waiting for a group, straggler drop, zero variance, no pair, next batch)."""
    ready: bool
    """A full batch (``Recipe.units_per_batch`` units) is available now, past those of the
    batches before it in the plan."""
    consumed: pl.DataFrame
    """(turn_id, trajectory_id, group_id, trajectory_started_at) of every step this batch uses;
    for dpo both the chosen and the rejected step."""
    final: pl.DataFrame
    """The rows of ``dropped`` that later plans drop too (``final_drops``), with their
    trajectory's ``trajectory_started_at``: to retire."""
    open_since_next: datetime | None
    """The earliest start (``started_at``, to the millisecond) of a step of a trajectory still
    in play once this batch and those before it in the plan are reserved (if ``ready``) and the
    final drops retired, or the newest start read when none is: the next plan's
    ``open_since``, valid only after the reservation committed. None for an empty table."""

    @cached_property
    def rows(self) -> pl.DataFrame:
        """The complete batch rows (``BATCH_ROWS``: with their turns' token lists and
        messages), as exports and trainers take them."""
        return complete_rows(self.planned, self.turns)

    def ledger_rows(self, recipe: str, planned_at: datetime) -> pl.DataFrame:
        """``derived_schemas.LEDGER`` rows marking this batch's steps consumed."""
        return fit(
            self.consumed.with_columns(
                pl.lit(recipe).alias("recipe"),
                pl.lit(self.batch_id).alias("batch_id"),
                pl.lit(planned_at).alias("planned_at"),
            ),
            LEDGER,
        )


PLANNED_COLUMNS = frozenset(
    {
        *(set(STORED_BATCH_ROWS.names) | set(DPO_PAIRS.names)),
        "trajectory_started_at",
        "ended_at",
        "step_reward",
        "trainable",
        "quality_score",
        "prompt_len",
        "response_len",
        "prefix_consistent",
        "prefix_break_reason",
        "status",
        "close_reason",
        "failed_calls",
    }
)
"""The curated columns a plan reads (its filters, credit, units and rows): the rest (e.g. the
response text) would only widen every sort and join of the open steps."""

LATER_COLUMNS = {"failed_calls": pl.Int32, "trajectory_started_at": pl.Datetime("us", "UTC")}
"""Planned columns that curated rows written before them lack: read as null."""

TRUNCATED = "length"
"""The finish reason of a reply cut off at max_tokens: it has no end-of-turn token."""

INFRA_FAILURE = "infra_failure"
"""The drop reason of every step of a trajectory with a call the engine or proxy failed
(``status`` error on a step, or ``failed_calls`` counting one that left no step): its reward
measures the infrastructure, not the policy, so it stays out of its group's statistics (the
group fills from other members or follows the straggler rule)."""

_INFRA_FAILED = (
    ((pl.col("status") == "error") | (pl.col("failed_calls") > 0)).fill_null(False).any()
).over("trajectory_id")
"""A trajectory with a failed call (``failed_calls`` is null on steps written before it)."""

UNFINISHED = frozenset({"aborted", "timeout"})
"""Close reasons of a trajectory that did not complete (``filters.unfinished``)."""


def _length_limits(recipe: Recipe) -> list[tuple[str, int, str]]:
    """(length column, limit, reason): the length filters, and the fixed widths when the recipe
    does not truncate (so every exported batch fits its widths), in the layout's tokens: a
    sequence's prompt is its segment's first prompt, its response everything after it."""
    f = recipe.filters
    fits = recipe.truncation == "error"
    prompt_width = recipe.prompt_length if fits else None
    response_width = recipe.response_length if fits else None
    prefix = "sequence_" if recipe.layout == "sequence" else ""
    limits = [
        (f"{prefix}prompt_len", [f.max_prompt_len, prompt_width], "prompt_too_long"),
        (f"{prefix}response_len", [f.max_response_len, response_width], "response_too_long"),
    ]
    return [
        (column, min(given), reason)
        for column, bounds, reason in limits
        if (given := [b for b in bounds if b is not None])
    ]


def _step_reasons(recipe: Recipe, latest_policy: pl.Expr) -> pl.Expr:
    """The first filter a step fails (null = eligible)."""
    f = recipe.filters
    checks: list[tuple[pl.Expr, str]] = [
        (~pl.col("trainable").fill_null(True), "untrainable"),
        (_INFRA_FAILED, INFRA_FAILURE),
    ]
    if f.unfinished == "drop":
        checks.append((pl.col("close_reason").is_in(list(UNFINISHED)), "unfinished"))
    if f.min_quality is not None:
        checks.append((pl.col("quality_score") < f.min_quality, "low_quality"))
    if f.require_reward:
        checks.append((~pl.col("reward_present").fill_null(False), "no_reward"))
    if f.max_policy_lag is not None:
        checks.append(((latest_policy - pl.col("policy_version")) > f.max_policy_lag, "stale"))
    for column, limit, reason in _length_limits(recipe):
        checks.append((pl.col(column) > limit, reason))
    if recipe.algorithm == "dpo" and not recipe.keep_truncated:
        checks.append((pl.col("finish_reason") == TRUNCATED, "truncated"))
    checks.append((pl.col("response_len").is_null(), "no_tokens"))
    reason = pl.lit(None, pl.String)
    for failed, name in reversed(checks):
        reason = pl.when(failed.fill_null(False)).then(pl.lit(name)).otherwise(reason)
    return reason


def first_start_bound(rows: pl.LazyFrame | pl.DataFrame) -> datetime | None:
    """The earliest ``trajectory_started_at`` of ``rows`` (curated rows, a batch's ledger rows):
    the bound of ``started_since`` for matching them. None when one is null (a row written
    before the column: its trajectory may have started any time); the latest time when there
    are no rows (none to match)."""
    first = pl.col("trajectory_started_at")
    earliest, unknown, count = (
        rows.lazy()
        .select(first.min().alias("earliest"), first.null_count().alias("unknown"), pl.len())
        .collect()
        .row(0)
    )
    if unknown:
        return None
    return earliest if count else datetime.max.replace(tzinfo=UTC)


def started_since(rows: pl.LazyFrame, bound: datetime | None) -> pl.LazyFrame:
    """The ledger or retirement rows that can be of a trajectory first started at ``bound`` or
    later: those whose ``trajectory_started_at`` is not earlier, or null (written before the
    column); all of them without a bound or the column. Exact, not a guess: a trajectory's
    first start only moves earlier as more of its steps land, so a row keeps one at or after
    its trajectory's first start now, which is at or after ``bound`` for every trajectory of
    the rows matched (``first_start_bound``). In a Delta scan the filter skips the files
    holding only trajectories started before ``bound``, so the read follows the rows in play,
    not the ledger's age."""
    if bound is None or "trajectory_started_at" not in rows.collect_schema().names():
        return rows
    return rows.filter(since("trajectory_started_at", bound))


def _unconsumed(recipe: Recipe, curated: pl.LazyFrame, excluded: pl.LazyFrame) -> pl.LazyFrame:
    """Credited curated steps the recipe has neither consumed nor retired: trajectory-based
    algorithms skip any trajectory with an excluded step, dpo skips excluded steps (credit is
    still assigned over the whole trajectory). The excluded keys of the curated rows read are
    collected first (``excluded``: the key columns of the ledger's and the retirements' rows of
    trajectories started since the earliest first start read, ``started_since``; a late step
    of a trajectory consumed long ago carries that trajectory's first start, so it still finds
    it), then the open trajectory ids (one plan joining the whole id columns took ~3x the
    memory), so planning holds the open trajectories' rows, not the table's. With none excluded
    in play (a recipe's first plan) every trajectory is open: nothing to match."""
    key = "turn_id" if recipe.algorithm == "dpo" else "trajectory_id"
    keys = (
        excluded.select(key)
        .join(curated.select(key), on=key, how="semi")
        .unique()
        .collect(engine="streaming")
    )
    if keys.is_empty():
        open_rows = curated.filter(pl.col("trajectory_id").is_not_null())
        return assign_credit(open_rows, recipe.credit_assignment)
    excluded = keys.lazy()
    open_trajectories = (
        curated.join(excluded, on=key, how="anti").select("trajectory_id").unique().collect()
    )
    open_rows = keyed(curated, "trajectory_id", open_trajectories.get_column("trajectory_id"))
    credited = assign_credit(open_rows, recipe.credit_assignment)
    return credited.join(excluded, on=key, how="anti") if key == "turn_id" else credited


FINAL_REASONS = frozenset(
    {
        "untrainable",
        INFRA_FAILURE,
        "unfinished",
        "low_quality",
        "no_reward",
        "stale",
        "prompt_too_long",
        "response_too_long",
        "truncated",
        "no_tokens",
        "trajectory_filtered",
        "below_min_reward",
        "no_group",
    }
)
"""Drops decided by the step's own trajectory: they stand until one of its curated rows changes
(staleness only grows, as the newest policy version never goes back)."""

FINAL_GROUP_REASONS = frozenset({"zero_variance", "straggler_dropped", "group_short"})
"""Drops of a whole group: they stand until a curated row of the group changes, provided every
other unconsumed member of the group is dropped for good too. A member waiting, overflowing or
queued for a later batch could still move into the group's first ``group_size``."""


def final_drops(recipe: Recipe, dropped: pl.DataFrame, pending: pl.Series) -> pl.DataFrame:
    """The rows of a plan's ``dropped`` that every later plan drops as well, as long as no curated
    row of their group (or of their trajectory, when it has none) changes.

    The drops of ``pending`` trajectories (``Units.pending``) are not final yet: their group
    still counts them. Leaving final drops out of later plans (``plan_batch(retired=...)``)
    changes no batch; it keeps planning from re-reading everything ever dropped (e.g. GRPO's
    many zero-variance groups).
    """
    final = pl.col("reason").is_in(list(FINAL_REASONS))
    if recipe.algorithm == "dpo":  # no_pair: its group's steps left cannot span the gap
        return dropped.filter(final | (pl.col("reason") == "no_pair"))
    by_group = pl.col("reason").is_in(list(FINAL_GROUP_REASONS))
    group_done = (final | by_group).all().over("group_id")
    held = pl.col("trajectory_id").is_in(pending.implode()).fill_null(False)
    return dropped.filter((final & ~held) | (by_group & group_done))


def plan_batch(
    recipe: Recipe,
    curated_steps: pl.LazyFrame | pl.DataFrame,
    turns: pl.LazyFrame | pl.DataFrame,
    ledger: pl.LazyFrame | pl.DataFrame | None,
    now: datetime,
    *,
    retired: pl.LazyFrame | pl.DataFrame | None = None,
    open_since: datetime | None = None,
    batch_id: str | None = None,
    source_versions: dict[str, int] | None = None,
    latest_policy_version: int | None = None,
) -> BatchPlan:
    """The next batch of ``recipe`` (``plan_batches`` for one). ``batch_id`` defaults to
    ``<recipe>-<n+1>`` with n the batches in the ledger."""
    if batch_id is None:
        batch_id = _next_batch_id(recipe, ledger)
    return plan_batches(
        recipe,
        curated_steps,
        turns,
        ledger,
        now,
        batch_ids=[batch_id],
        retired=retired,
        open_since=open_since,
        source_versions=source_versions,
        latest_policy_version=latest_policy_version,
    )[0]


def plan_batches(
    recipe: Recipe,
    curated_steps: pl.LazyFrame | pl.DataFrame,
    turns: pl.LazyFrame | pl.DataFrame,
    ledger: pl.LazyFrame | pl.DataFrame | None,
    now: datetime,
    *,
    batch_ids: list[str],
    first: int = 0,
    retired: pl.LazyFrame | pl.DataFrame | None = None,
    open_since: datetime | None = None,
    source_versions: dict[str, int] | None = None,
    latest_policy_version: int | None = None,
) -> list[BatchPlan]:
    """Select the next batches of ``recipe`` from curated steps not yet in its ledger, from
    one read: the batches at positions ``first``, ``first + 1``, ... of the plan, one per id of
    ``batch_ids`` up to the first that is not ready (a batch is ready when the units before it
    leave enough for it). The batch at a position is the same whichever positions are asked
    for, so a batch reserved together with others re-plans alone from its pins and position.

    Rewards are re-credited with the recipe's credit assignment; staleness is measured against
    ``latest_policy_version`` (the assets pass ``policy.versions.lag_reference``, the highest
    announced version; default: the newest policy_version among all curated steps, consumed or
    not). Trajectory-based algorithms
    skip any trajectory with a consumed step (so late steps of a consumed trajectory never
    form a fragment); dpo skips consumed steps. Everything is ordered by explicit keys
    (start time, then ids), so the same inputs and ``now`` give the same batches. ``retired``
    steps (rows of earlier plans' ``final_drops``) are left out like consumed ones.
    ``open_since`` (an earlier plan's ``open_since_next``, lowered to the start of any
    trajectory changed since) says every step that started before it belongs to a trajectory
    consumed or retired: only the curated steps started since are read, which file statistics
    make cheap whatever the trajectory ids look like (they need not sort by time), and of the
    ledger and the retirements only the rows of trajectories first started since the earliest
    of those steps' trajectories (``started_since``), which their file statistics make cheap
    likewise. Planning reads only the narrow curated columns: a grpo-style batch's rows point
    at their turns (``BatchPlan.rows`` reads their token lists from ``turns``); dpo reads the
    eligible steps' token lists to pair them.
    """
    curated = curated_steps.lazy()
    if latest_policy_version is None:
        latest_policy_version = curated.select(pl.col("policy_version").max()).collect().item()
    curated = curated.filter(_in_play(open_since))
    frame = _candidates(recipe, curated, [ledger, retired], latest_policy_version)
    versions = json.dumps(source_versions or {}, sort_keys=True)
    if recipe.algorithm == "dpo":
        batches = dpo_batches(recipe, frame, turns, batch_ids, first, versions)
    else:
        batches = trajectory_batches(recipe, frame, now, batch_ids, first, versions)
    return [
        _plan(recipe, batch_id, units, frame, curated, open_since, turns)
        for batch_id, units in zip(batch_ids, batches, strict=False)
    ]


def _plan(
    recipe: Recipe,
    batch_id: str,
    units: Units,
    frame: pl.DataFrame,
    curated: pl.LazyFrame,
    open_since: datetime | None,
    turns: pl.LazyFrame | pl.DataFrame,
) -> BatchPlan:
    """One batch's plan from its ``units`` of the candidate steps ``frame``."""
    dropped = fit(units.dropped.sort("reason", "trajectory_id", "turn_id"), DROPPED)
    final = _with_first_start(final_drops(recipe, dropped, units.pending), frame)
    settled = [final, units.consumed_before]
    if units.ready:
        settled.append(units.consumed)
    return BatchPlan(
        batch_id=batch_id,
        planned=units.rows,
        turns=None if recipe.algorithm == "dpo" else turns,
        dropped=dropped,
        ready=units.ready,
        consumed=_with_first_start(units.consumed, frame).sort("turn_id"),
        final=final,
        open_since_next=_open_since_next(
            frame, pl.concat(part.select("turn_id") for part in settled), curated, open_since
        ),
    )


def _next_batch_id(recipe: Recipe, ledger: pl.LazyFrame | pl.DataFrame | None) -> str:
    """``<recipe>-<n+1>``, n the batches in the ledger."""
    batches_so_far = 0
    if ledger is not None:
        batches_so_far = ledger.lazy().select(pl.col("batch_id").n_unique()).collect().item()
    return f"{recipe.name}-{batches_so_far + 1:06d}"


def _in_play(open_since: datetime | None) -> pl.Expr:
    """The curated rows a plan reading from ``open_since`` reads (a step started before it
    belongs to a trajectory consumed or retired)."""
    if open_since is None:
        return pl.lit(True)
    return since("started_at", open_since)


def _candidates(
    recipe: Recipe,
    curated: pl.LazyFrame,
    excluding: list[pl.LazyFrame | pl.DataFrame | None],
    latest_policy_version: int | None,
) -> pl.DataFrame:
    """The credited curated steps in play that no frame of ``excluding`` (ledger, retired
    steps) holds, each with the first filter it fails (``_reason``), in batch order."""
    names = curated.collect_schema().names()
    absent = {name: dtype for name, dtype in LATER_COLUMNS.items() if name not in names}
    curated = curated.select(name for name in names if name in PLANNED_COLUMNS).with_columns(
        pl.lit(None, dtype).alias(name) for name, dtype in absent.items()
    )
    settled = [frame.lazy() for frame in excluding if frame is not None]
    bound = first_start_bound(curated) if settled else None
    excluded = [started_since(frame, bound).select("turn_id", "trajectory_id") for frame in settled]
    candidates = (
        _unconsumed(recipe, curated, pl.concat(excluded))
        if excluded
        else assign_credit(curated, recipe.credit_assignment)
    )
    latest = pl.lit(latest_policy_version, pl.Int64)
    candidates = candidates.with_columns(segment_index())
    if recipe.layout == "sequence":
        candidates = candidates.with_columns(sequence_lengths())
    return (
        candidates.with_columns(_step_reasons(recipe, latest).alias("_reason"))
        .sort("started_at", "trajectory_id", "step_index", "turn_id")
        .collect(engine="streaming")
    )


def _with_first_start(rows: pl.DataFrame, candidates: pl.DataFrame) -> pl.DataFrame:
    """``rows`` of ``candidates`` with their trajectory's ``trajectory_started_at`` (its rows
    hold one value), which the ledger and the retirements keep."""
    firsts = candidates.group_by("trajectory_id").agg(pl.col("trajectory_started_at").max())
    return rows.join(firsts, on="trajectory_id", how="left", maintain_order="left")


def _open_since_next(
    candidates: pl.DataFrame,
    settled: pl.DataFrame,
    curated: pl.LazyFrame,
    open_since: datetime | None,
) -> datetime | None:
    """The earliest start among the curated rows read of each trajectory with a candidate not
    ``settled`` (consumed by this batch, retired), floored to the millisecond of Delta's file
    statistics so that no file holding such a row is skipped; when none is left, the next
    millisecond after the newest start read: every step read is settled, and what lands later
    starts later or shows in the change feed. Every row of a trajectory in play counts,
    consumed dpo steps too (credit is assigned over the whole trajectory)."""
    in_play = candidates.join(settled, on="turn_id", how="anti").select("trajectory_id").unique()
    if in_play.height:
        rows = curated.join(in_play.lazy(), on="trajectory_id", how="semi")
        earliest = rows.select(pl.col("started_at").min()).collect().item()
        return open_since if earliest is None else floor_ms(earliest)
    newest = curated.select(pl.col("started_at").max()).collect().item()
    return open_since if newest is None else floor_ms(newest) + timedelta(milliseconds=1)
