"""Trajectory inference for turns that arrived without identity.

A turn continues an earlier turn when its prompt starts with that turn's prompt + response
(the agent sent the history back and appended to it); otherwise it starts a new trajectory,
named ``inferred-<its turn_id>``.

Matching is a hash join, linear in the tokens of the identity-less turns: every token gets a
hash of (token, position), and the running sum of those hashes along a sequence is a prefix
hash. A candidate predecessor is keyed by (length, hash) of its full sequence; a turn's prompt
offers (p, prefix hash at p) for every position p, and the join yields the turns whose prompt
could extend it. Candidates are then checked token by token. (A first-tokens key does not work:
agents share long system prompts, which would put every turn in one bucket.)

A turn's candidate predecessors are the earlier turns (by started_at, then turn_id) whose
sequence its prompt extends with the greatest length. Those are token-identical: one key, a
bucket that other turns can share, e.g. when several agents run the same task and their first
turns are identical (GRPO rollouts). Within a bucket each predecessor takes at most one
successor: successors, in start order, each take the earliest predecessor still free among those
that started before them, so N identical turns continued N times become N trajectories. A
successor that finds none free starts its own trajectory (a second continuation of the same
turn, e.g. a retry, does so unless an identical turn is still free). The last turns of known
inferred trajectories are predecessors like the new turns. The agent column is not used: it
names the agent program, which the rollouts of a task share.
Chains are resolved by pointer jumping (log of chain length joins, not a loop over rows).
Sequences shorter than ``min_tokens`` are never continued (too short to be evidence).
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.transforms.prefixes import extends, full_sequence

_MAX_JUMPS = 64
_SEED = 0x5EED
_BUCKET = ["end", "prefix_hash"]
"""The key of a full sequence: predecessors with the same key are interchangeable."""


def _before(at: pl.Expr, key: pl.Expr, other_at: pl.Expr, other_key: pl.Expr) -> pl.Expr:
    """(at, key) sorts strictly before (other_at, other_key)."""
    return (at < other_at) | ((at == other_at) & (key < other_key))


def _prefix_hashes(sequences: pl.DataFrame, column: str) -> pl.DataFrame:
    """(turn_id, end, hash of the first ``end`` tokens) for every prefix of ``column``."""
    return (
        sequences.select("turn_id", pl.col(column).alias("_token"))
        .explode("_token", empty_as_null=False)
        .with_columns(pl.int_range(1, pl.len() + 1).over("turn_id").alias("end"))
        .with_columns(
            pl.struct("_token", "end").hash(_SEED).cum_sum().over("turn_id").alias("prefix_hash")
        )
        .drop("_token")
    )


def infer_trajectories(
    new: pl.DataFrame, known_tails: pl.DataFrame, *, min_tokens: int
) -> pl.DataFrame:
    """``(turn_id, trajectory_id)`` for every turn of ``new`` (turns with trajectory_id null).

    ``known_tails``: the last turn of each inferred trajectory already known (open or recently
    closed): turn_id, trajectory_id, prompt_token_ids, response_token_ids, started_at.
    """
    cols = ["turn_id", "prompt_token_ids", "response_token_ids", "started_at"]
    candidates = (
        pl.concat(
            [
                new.select(*cols, pl.lit(None, dtype=pl.String).alias("trajectory_id")),
                known_tails.select(*cols, "trajectory_id"),
            ]
        )
        .with_columns(full_sequence("prompt_token_ids", "response_token_ids").alias("_full"))
        .filter(pl.col("_full").list.len() >= min_tokens)
    )
    lengths = candidates.select(
        "turn_id",
        pl.col("_full").list.len().alias("_full_len"),
        pl.col("prompt_token_ids").list.len().alias("_prompt_len"),
    )
    hashes = _prefix_hashes(candidates, "_full").join(lengths, on="turn_id")
    keys = (
        hashes.filter(pl.col("end") == pl.col("_full_len"))
        .select("turn_id", "end", "prefix_hash")
        .join(candidates.select("turn_id", "trajectory_id", "started_at", "_full"), on="turn_id")
        .rename(
            {"turn_id": "pred", "trajectory_id": "pred_trajectory", "started_at": "pred_started"}
        )
        .sort("pred_started", "pred")
        .with_columns(pl.int_range(1, pl.len() + 1).over(_BUCKET).alias("pred_rank"))
    )
    successors = new.select("turn_id", "started_at", "prompt_token_ids")
    offers = hashes.filter(
        (pl.col("end") <= pl.col("_prompt_len")) & (pl.col("end") >= min_tokens)
    ).join(successors.select("turn_id"), on="turn_id")
    matches = (
        offers.select("turn_id", "end", "prefix_hash")
        .join(keys, on=["end", "prefix_hash"])
        .join(successors, on="turn_id")
        .filter(
            (pl.col("pred") != pl.col("turn_id"))
            & _before(
                pl.col("pred_started"), pl.col("pred"), pl.col("started_at"), pl.col("turn_id")
            )
            & extends(pl.col("prompt_token_ids"), pl.col("_full"))
        )
        .filter(pl.col("end") == pl.col("end").max().over("turn_id"))
    )
    # Successors of a bucket in start order each take the earliest free predecessor among the
    # n_k started before them (n_k grows with k), so after k of them c_k = min(c_(k-1) + 1, n_k)
    # are taken, i.e. c_k = k + min(0, min over j <= k of n_j - j). The k-th took predecessor
    # c_k (in start order) if c_k grew; else none was free.
    taken = (
        matches.group_by("turn_id", "started_at", *_BUCKET)
        .agg(pl.len().alias("_before"))
        .sort("started_at", "turn_id")
        .with_columns(pl.int_range(1, pl.len() + 1).over(_BUCKET).alias("_k"))
        .with_columns(
            (pl.col("_k") + (pl.col("_before") - pl.col("_k")).cum_min().clip(upper_bound=0))
            .over(_BUCKET)
            .alias("pred_rank")
        )
        .filter(pl.col("pred_rank") > pl.col("pred_rank").shift(1, fill_value=0).over(_BUCKET))
    )
    links = matches.join(taken.select("turn_id", "pred_rank"), on=["turn_id", "pred_rank"]).select(
        "turn_id", "pred", "pred_trajectory"
    )
    chain = (
        new.select("turn_id")
        .join(links, on="turn_id", how="left")
        .with_columns(
            pl.when(pl.col("pred").is_null())
            .then(pl.lit("inferred-") + pl.col("turn_id"))
            .otherwise(pl.col("pred_trajectory"))
            .alias("trajectory_id")
        )
    )
    for _ in range(_MAX_JUMPS):
        if chain["trajectory_id"].null_count() == 0:
            break
        hop = chain.select(
            pl.col("turn_id").alias("pred"),
            pl.col("pred").alias("_pred2"),
            pl.col("trajectory_id").alias("_tid2"),
        )
        chain = (
            chain.join(hop, on="pred", how="left")
            .with_columns(
                pl.coalesce("trajectory_id", "_tid2").alias("trajectory_id"),
                pl.col("_pred2").alias("pred"),
            )
            .drop("_pred2", "_tid2")
        )
    return chain.select("turn_id", "trajectory_id")
