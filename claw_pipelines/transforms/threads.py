"""Side calls inside one trajectory become side trajectories linked to it.

Agents send the same identity on every call of a session, also on calls that do not continue
its conversation: title and summary calls, sub-agents and a small model's helper calls with
their own system prompt (Claude Code), sub-agents that start from the conversation's system
prompt (Codex). When a trajectory with identity is emitted, its steps (those with token IDs, in
start order) are split into threads:

- a step continues the step before it when its prompt extends that step's prompt + response,
  or differs from it only in the response's rendering or by a ``tail_edit``
  (``prefixes.check_prefixes``);
- a ``context_edit`` step continues instead an earlier step that nothing continues yet, when
  its prompt extends that step's prompt + response (the longest such) or tail-edits it
  (``inference.continuation_links``: one successor per step, the earliest);
- else it stays a ``context_edit`` of the step before it, when nothing continues that step and
  the edit kept the conversation's opening: both requests start with the same first message
  (system prompt), or the step shares at least half its prompt with that step (a trimmed or
  compacted history, an edited message);
- else it starts a new thread.

The **main** thread is the earliest one with more than one step (side calls that come before the
conversation, such as a title call, are one-shot), or when none has more than one, the one with
the longest prompt. Every other thread becomes the trajectory ``<trajectory_id>/side-<turn_id of
its first step>`` (deterministic: a rebuild from the same turns gives the same ids), with
``parent_trajectory_id`` = the trajectory and no ``group_id``, so it neither joins its parent's
GRPO group nor breaks it. Steps without token IDs stay in the main thread. Inferred
trajectories (no identity: already one per conversation) and late turns of an already emitted
trajectory are not split.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from claw_pipelines.derived_schemas import with_turn_columns
from claw_pipelines.transforms.inference import chain_roots, continuation_links

_MOVED = ["turn_id", "trajectory_id", "parent_trajectory_id"]
CONTINUING = [None, "tail_edit", "template_change", "retokenized"]
"""Break reasons of a step that still continues the step before it (the history was kept)."""


def side_trajectory_id(parent: pl.Expr, first_turn: pl.Expr) -> pl.Expr:
    return parent + pl.lit("/side-") + first_turn


def side_threads(
    checked: pl.DataFrame,
    tokens: Callable[[pl.Series], pl.DataFrame],
    *,
    min_tokens: int,
    landed: pl.LazyFrame | pl.DataFrame | None = None,
) -> pl.DataFrame:
    """``(turn_id, trajectory_id, parent_trajectory_id)`` of the steps that move to a side
    trajectory (none when no trajectory has a ``context_edit``).

    ``checked``: the steps to emit with their verdict against the step before them
    (``prefixes.check_prefixes``), and ``_row`` (a step's row for ``tokens``, which gives
    the whole prompt and response IDs of rows: only those of the trajectories with a
    ``context_edit`` are asked for), ``_prev`` (the ``_row`` of the step before), ``_tokens``
    (prompt IDs present), ``prompt_len``, ``trajectory_inferred``, ``reopened``,
    ``request_messages`` (null where not read: then read from the ``landed`` turns for the
    few steps that need it).
    """
    splittable = (
        ~pl.col("trajectory_inferred").fill_null(False) & ~pl.col("reopened") & pl.col("_tokens")
    )
    steps = checked.lazy().filter(splittable).select(
        "turn_id", "trajectory_id", "started_at", "_row", "_prev", "request_messages",
        "prefix_break_reason", "shared_prefix_tokens",
        pl.col("prompt_len").alias("_prompt_len"),
    ).collect()  # fmt: skip
    broken = steps.filter(pl.col("prefix_break_reason") == "context_edit")
    if broken.is_empty():
        return pl.DataFrame(schema=dict.fromkeys(_MOVED, pl.String))
    steps = steps.join(broken.select("trajectory_id").unique(), on="trajectory_id", how="semi")
    links = _links(steps, broken, tokens, min_tokens, _openings(steps, broken, landed))
    threads = _threads(steps, chain_roots(links, steps["turn_id"]))
    return threads.filter(~pl.col("_main")).select(
        "turn_id",
        side_trajectory_id(pl.col("trajectory_id"), pl.col("root")).alias("trajectory_id"),
        pl.col("trajectory_id").alias("parent_trajectory_id"),
    )


def regroup(frame: pl.DataFrame, moved: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The trajectories ``moved`` (from ``side_threads``) splits, and their rows of ``frame``
    with the side steps in their side trajectories (no group), sorted for numbering."""
    split = moved.select(pl.col("parent_trajectory_id").alias("trajectory_id")).unique()
    side = pl.col("_side")
    regrouped = (
        frame.join(split, on="trajectory_id", how="semi")
        .join(moved.select("turn_id", pl.col("trajectory_id").alias("_side")), on="turn_id",
              how="left")
        .with_columns(
            pl.when(side.is_not_null()).then("trajectory_id").alias("parent_trajectory_id"),
            pl.when(side.is_null()).then("group_id").alias("group_id"),
            pl.coalesce(side, "trajectory_id").alias("trajectory_id"),
        )
        .drop("_side")
        .sort("trajectory_id", "started_at", "turn_id")
    )  # fmt: skip
    return split, regrouped


def _openings(
    steps: pl.DataFrame, broken: pl.DataFrame, landed: pl.LazyFrame | pl.DataFrame | None
) -> pl.DataFrame:
    """``(_row, _opening)``: the first request message of the ``context_edit`` steps and of
    the steps before them, from ``request_messages`` where the steps carry it, else read from
    the ``landed`` turns (whole, ``turn_prompts``) for these steps only."""
    rows = pl.concat([broken.get_column("_row"), broken.get_column("_prev").drop_nulls()])
    needed = steps.filter(pl.col("_row").is_in(rows.implode())).select(
        "_row", "turn_id", "started_at", "request_messages"
    )
    unread = needed.filter(pl.col("request_messages").is_null())
    if landed is not None and unread.height:
        read = with_turn_columns(unread.drop("request_messages"), landed, ["request_messages"])
        needed = pl.concat([needed.filter(pl.col("request_messages").is_not_null()), read])
    opening = pl.col("request_messages").str.json_path_match("$[0]")
    return needed.select("_row", opening.alias("_opening"))


def _links(
    steps: pl.DataFrame,
    broken: pl.DataFrame,
    tokens: Callable[[pl.Series], pl.DataFrame],
    min_tokens: int,
    openings: pl.DataFrame,
) -> pl.DataFrame:
    """``(turn_id, pred)`` for every step that continues or edits an earlier one;
    ``openings`` from ``_openings``."""
    continuing = steps.filter(pl.col("prefix_break_reason").is_in(CONTINUING, nulls_equal=True))
    adjacent = continuing.filter(pl.col("_prev").is_not_null()).select(
        "turn_id", pl.col("_prev").alias("_pred")
    )
    by_row = steps.select(pl.col("_row").alias("_pred"), pl.col("turn_id").alias("pred"))
    adjacent = adjacent.join(by_row, on="_pred").select("turn_id", "pred")
    free = steps.join(adjacent.select(pl.col("pred").alias("turn_id")), on="turn_id", how="anti")
    columns = ["turn_id", "trajectory_id", "started_at", "_row"]
    candidates = free.select(columns)
    both = _with_tokens(pl.concat([broken.select(columns), candidates]), tokens)
    found = continuation_links(
        both.head(broken.height),
        both.tail(candidates.height),
        min_tokens=min_tokens,
        scope="trajectory_id",
    )
    predecessors = by_row.join(
        openings.select(pl.col("_row").alias("_pred"), pl.col("_opening").alias("_pred_opening")),
        on="_pred",
        how="left",
    )
    edits = (
        broken.join(found, on="turn_id", how="anti")
        .join(openings, on="_row", how="left")
        .with_columns(pl.col("_prev").alias("_pred"))
        .join(predecessors, on="_pred")
        .join(found.select(pl.col("pred")), on="pred", how="anti")
        .filter(
            (pl.col("_opening") == pl.col("_pred_opening")).fill_null(False)
            | (pl.col("shared_prefix_tokens") * 2 >= pl.col("_prompt_len"))
        )
        .select("turn_id", "pred")
    )
    return pl.concat([adjacent, found, edits])


def _with_tokens(steps: pl.DataFrame, tokens: Callable[[pl.Series], pl.DataFrame]) -> pl.DataFrame:
    """``steps`` with their whole prompt and response IDs (asked for at once)."""
    return steps.hstack(tokens(steps.get_column("_row")).get_columns())


def _threads(steps: pl.DataFrame, roots: pl.DataFrame) -> pl.DataFrame:
    """Each step's thread (``root``) and whether it is the trajectory's main thread."""
    steps = steps.join(roots, on="turn_id")
    single = pl.col("_steps") == 1
    ranked = (
        steps.group_by("trajectory_id", "root")
        .agg(
            pl.len().alias("_steps"),
            pl.col("started_at").min().alias("_started"),
            pl.col("_prompt_len").max().alias("_longest"),
        )
        .with_columns(
            single.alias("_single"),
            pl.when(single).then(-pl.col("_longest").cast(pl.Int64)).otherwise(0).alias("_size"),
        )
        .sort("trajectory_id", "_single", "_size", "_started", "root")
        .with_columns((pl.int_range(pl.len()).over("trajectory_id") == 0).alias("_main"))
    )
    return steps.join(ranked.select("trajectory_id", "root", "_main"), on=["trajectory_id", "root"])
