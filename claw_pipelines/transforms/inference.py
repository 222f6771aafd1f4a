"""Trajectory inference for turns that arrived without identity.

A turn continues an earlier turn when its prompt starts with that turn's prompt + response
(the agent sent the history back and appended to it); otherwise it starts a new trajectory,
named ``inferred-<its turn_id>``. Candidates are matched by a join on the hash of their first
``key_tokens`` tokens (so only turns sharing a beginning are compared), then checked exactly.
Each turn's predecessor is the longest matching sequence; a predecessor keeps only its earliest
successor (a second continuation of the same turn, e.g. a retry, starts its own trajectory).
Chains are resolved by pointer jumping (log of chain length joins, not a loop over rows).
Sequences shorter than ``key_tokens`` cannot be continued.
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.transforms.prefixes import extends, full_sequence

_MAX_JUMPS = 64


def _before(at: pl.Expr, key: pl.Expr, other_at: pl.Expr, other_key: pl.Expr) -> pl.Expr:
    """(at, key) sorts strictly before (other_at, other_key)."""
    return (at < other_at) | ((at == other_at) & (key < other_key))


def infer_trajectories(
    new: pl.DataFrame, known_tails: pl.DataFrame, *, key_tokens: int
) -> pl.DataFrame:
    """``(turn_id, trajectory_id)`` for every turn of ``new`` (turns with trajectory_id null).

    ``known_tails``: the last turn of each inferred trajectory already known (open or recently
    closed): turn_id, trajectory_id, prompt_token_ids, response_token_ids, started_at.
    """
    cols = ["turn_id", "prompt_token_ids", "response_token_ids", "started_at"]
    candidates = pl.concat(
        [
            new.select(*cols, pl.lit(None, dtype=pl.String).alias("trajectory_id")),
            known_tails.select(*cols, "trajectory_id"),
        ]
    ).with_columns(full_sequence("prompt_token_ids", "response_token_ids").alias("_full"))
    candidates = candidates.filter(pl.col("_full").list.len() >= key_tokens).select(
        pl.col("turn_id").alias("pred"),
        pl.col("trajectory_id").alias("pred_trajectory"),
        pl.col("started_at").alias("pred_started"),
        "_full",
        pl.col("_full").list.head(key_tokens).hash().alias("_key"),
    )
    successors = (
        new.select("turn_id", "started_at", "prompt_token_ids")
        .filter(pl.col("prompt_token_ids").list.len() >= key_tokens)
        .with_columns(pl.col("prompt_token_ids").list.head(key_tokens).hash().alias("_key"))
    )
    links = (
        successors.join(candidates, on="_key")
        .filter(
            (pl.col("pred") != pl.col("turn_id"))
            & _before(
                pl.col("pred_started"), pl.col("pred"), pl.col("started_at"), pl.col("turn_id")
            )
            & extends(pl.col("prompt_token_ids"), pl.col("_full"))
        )
        .with_columns(pl.col("_full").list.len().alias("_len"))
        .sort(["turn_id", "_len", "pred_started", "pred"], descending=[False, True, True, True])
        .unique("turn_id", keep="first", maintain_order=True)
        .sort(["pred", "started_at", "turn_id"])
        .unique("pred", keep="first", maintain_order=True)
        .select("turn_id", "pred", "pred_trajectory")
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
