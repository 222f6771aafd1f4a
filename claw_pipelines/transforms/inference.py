"""Which earlier turn a turn continues, by token prefix; trajectory inference for turns that
arrived without identity.

A turn continues an earlier turn when its prompt starts with that turn's prompt + response
(the agent sent the history back and appended to it), or when it is a ``tail_edit`` of it
(``prefixes.tail_edit``: the earlier prompt without its trailing message(s), then the earlier
response: an agent that ends every request with a context message it replaces on each call).
An identity-less turn that continues none starts a new trajectory, named
``inferred-<its turn_id>``.

Matching is a hash join, linear in the tokens of the successors: every token gets a hash of
(token, position), and the running sum of those hashes along a sequence is a prefix hash. A
candidate predecessor is keyed by (length, hash) of its full sequence; a successor's prompt
offers (p, prefix hash at p) for every position p, and the join yields the turns whose prompt
could extend it. For tail edits the predecessors' prompt prefixes ending in their last
``MAX_TAIL_TOKENS`` + ``HEADER_TOKENS`` positions form a prefix tree; walking a successor's
prompt through it names the predecessors whose shared prefix with it ends there
(``_tail_matches``). Candidates are then checked token by token. (A
first-tokens key does not work: agents share long system prompts, which would put every turn in
one bucket.)

A turn's candidate predecessors are the earlier turns (by started_at, then turn_id) whose
sequence its prompt extends with the greatest length (else, that it tail-edits with the longest
shared prefix). Those are token-identical: one key, a bucket that other turns can share, e.g.
when several agents run the same task and their first turns are identical (GRPO rollouts).
Within a bucket each predecessor takes at most one successor: successors, in start order, each
take the earliest predecessor still free among those that started before them, so N identical
turns continued N times become N trajectories. A successor that finds none free starts its own
trajectory (a second continuation of the same turn, e.g. a retry, does so unless an identical
turn is still free). The last turns of known inferred trajectories are predecessors like the new
turns. The agent column is not used: it names the agent program, which the rollouts of a task
share. Chains are resolved by pointer jumping (log of chain length joins, not a loop over rows).
Sequences shorter than ``min_tokens`` are never continued (too short to be evidence).
"""

from __future__ import annotations

import polars as pl

from claw_pipelines.transforms.prefixes import (
    HEADER_TOKENS,
    MAX_TAIL_TOKENS,
    extends,
    full_sequence,
    tail_edit,
)

_MAX_JUMPS = 64
_SEED = 0x5EED
SCOPE = "_scope"
"""Successors and predecessors match only within the same value of this column (a hash)."""
_BUCKET = [SCOPE, "end", "prefix_hash"]
"""The key of a full sequence: predecessors with the same key are interchangeable."""
_CANDIDATE = ["turn_id", SCOPE, "prompt_token_ids", "response_token_ids", "started_at"]
TAIL_GROUP_LIMIT = 256
"""The most turns that may share the prefix a tail edit keeps (identical rollouts of one task
do); a prefix shared by more is common to many sessions (a system prompt), no evidence."""
TAIL_DEPTHS = 4
"""How many of the points where predecessors leave a successor's prefix are looked at."""


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


def _scoped(frame: pl.DataFrame, scope: str | None) -> pl.DataFrame:
    """``frame`` with ``SCOPE``: a hash of the ``scope`` column (numeric join keys are cheap)."""
    value = pl.col(scope).hash(_SEED) if scope else pl.lit(0, pl.UInt64)
    return frame.with_columns(value.alias(SCOPE))


def _offers(successors: pl.DataFrame, candidates: pl.DataFrame, hashes: pl.DataFrame):
    """(turn_id, scope, end, prefix hash) of every prefix of the successors' prompts, each
    turn's rows together and in ``end`` order; those of successors that are candidates too are
    read off the candidates' hashes, not hashed again."""
    prompts = successors.select("turn_id", SCOPE, "prompt_token_ids")
    hashed = prompts.join(candidates, on="turn_id", how="semi")
    rest = prompts.join(candidates, on="turn_id", how="anti")
    return pl.concat(
        [
            hashes.join(hashed.select("turn_id"), on="turn_id", maintain_order="left")
            .filter(pl.col("end") <= pl.col("_prompt_len"))
            .select("turn_id", SCOPE, "end", "prefix_hash"),
            _prefix_hashes(rest, "prompt_token_ids")
            .join(rest.select("turn_id", SCOPE), on="turn_id", maintain_order="left")
            .select("turn_id", SCOPE, "end", "prefix_hash"),
        ]
    )


def _exact_matches(offers: pl.DataFrame, keys: pl.DataFrame, successors: pl.DataFrame):
    """Successor prompts that extend a predecessor's full sequence."""
    return (
        offers.join(keys, on=_BUCKET)
        .join(successors.select("turn_id", "started_at", "prompt_token_ids"), on="turn_id")
        .filter(extends(pl.col("prompt_token_ids"), pl.col("_full")))
        .select("turn_id", "started_at", "pred", "pred_rank", *_BUCKET,
                pl.lit(0).alias("_kind"), pl.col("end").alias("_length"))
    )  # fmt: skip


def _tail_matches(
    offers: pl.DataFrame,
    tail_hashes: pl.DataFrame,
    keys: pl.DataFrame,
    candidates: pl.DataFrame,
    successors: pl.DataFrame,
) -> pl.DataFrame:
    """Successor prompts that are tail edits of a predecessor (``prefixes.tail_edit``).

    The prefix a tail edit keeps ends in the last ``MAX_TAIL_TOKENS`` + ``HEADER_TOKENS``
    positions of the predecessor's prompt (``tail_hashes``: the prefix hashes of those
    positions). They are grouped by (position, hash), a prefix tree of the predecessors' tails.
    Along a successor's prompt, a predecessor leaves
    the tree where the member count drops: there its shared prefix with the successor ends. The
    ``TAIL_DEPTHS`` deepest such points with an earlier member name the candidates (a sibling
    that shares even more, e.g. another rollout's later call, leaves deeper and does not hide
    the true predecessor). Points of more than ``TAIL_GROUP_LIMIT`` members (a system prompt
    common to many sessions) are passed over, so no successor is paired with every session."""
    node = [SCOPE, "end", "prefix_hash"]
    members = tail_hashes.select(pl.col("turn_id").alias("pred"), *node).join(
        keys.select("pred", "pred_started"), on="pred"
    )
    nodes = members.group_by(node).agg(
        pl.len().alias("_members"), pl.col("pred_started").min().alias("_first")
    )
    count = pl.col("_members")
    next_node = (pl.col("turn_id").shift(-1) == pl.col("turn_id")) & (
        pl.col("end").shift(-1) == pl.col("end") + 1
    )
    after = pl.when(next_node).then(count.shift(-1)).otherwise(0)
    leaving = (
        offers.join(nodes, on=node, maintain_order="left")
        .filter((count > after) & (count <= TAIL_GROUP_LIMIT))
        .join(successors.select("turn_id", "started_at"), on="turn_id")
        .filter(pl.col("_first") < pl.col("started_at"))
        .sort("end", descending=True)
        .group_by("turn_id")
        .head(TAIL_DEPTHS)
        .select("turn_id", *node)
    )
    pairs = (
        leaving.join(members.select("pred", *node), on=node)
        .filter(pl.col("pred") != pl.col("turn_id"))
        .group_by("turn_id", "pred")
        .agg(pl.col("end").max())
    )
    return _verified_tails(pairs, keys, candidates, successors)


def _tail_search(
    offers: pl.DataFrame,
    hashes: pl.DataFrame,
    keys: pl.DataFrame,
    candidates: pl.DataFrame,
    successors: pl.DataFrame,
    exact: pl.DataFrame,
) -> pl.DataFrame:
    """``_tail_matches`` between the successors without an exact match and the predecessors
    nothing extends that started before one of them: when most turns append, the prefix
    trees stay small (or empty, e.g. for first turns that started before any free end)."""
    unmatched = successors.join(exact, on="turn_id", how="anti")
    free = keys.select("pred", "pred_started").join(exact.select("pred"), on="pred", how="anti")
    at = successors.schema["started_at"]
    free = free.filter(pl.col("pred_started") <= pl.lit(unmatched["started_at"].max(), at))
    unmatched = unmatched.filter(pl.col("started_at") >= pl.lit(free["pred_started"].min(), at))
    window = pl.col("end").is_between(
        pl.col("_prompt_len") - MAX_TAIL_TOKENS - HEADER_TOKENS, pl.col("_prompt_len") - 1
    ) & (pl.col("_full_len") > pl.col("_prompt_len"))
    tail_hashes = hashes.join(
        free.select(pl.col("pred").alias("turn_id")), on="turn_id", how="semi"
    ).filter(window)
    return _tail_matches(
        offers.join(unmatched.select("turn_id"), on="turn_id", maintain_order="left"),
        tail_hashes,
        keys,
        candidates,
        unmatched,
    )


def _verified_tails(
    pairs: pl.DataFrame, keys: pl.DataFrame, candidates: pl.DataFrame, successors: pl.DataFrame
) -> pl.DataFrame:
    """The (successor, predecessor, shared length) ``pairs`` that are tail edits, token for
    token, as matches."""
    shared, query = pl.col("end"), pl.col("prompt_token_ids")
    prompt, response = pl.col("_pred_prompt"), pl.col("_pred_response")
    tokens = candidates.select(
        pl.col("turn_id").alias("pred"),
        pl.col("prompt_token_ids").alias("_pred_prompt"),
        pl.col("response_token_ids").alias("_pred_response"),
    )
    verified = (
        pairs.join(successors.select("turn_id", "started_at", "prompt_token_ids"), on="turn_id")
        .join(tokens, on="pred")
        .filter(
            (query.list.head(shared) == prompt.list.head(shared))
            & (query.list.get(shared, null_on_oob=True) != prompt.list.get(shared))
            & tail_edit(query, prompt, response, shared)
        )
    )
    return verified.select("turn_id", "started_at", "pred", pl.col("end").alias("_length")).join(
        keys.select("pred", "pred_rank", *_BUCKET), on="pred"
    ).select("turn_id", "started_at", "pred", "pred_rank", *_BUCKET,
             pl.lit(1).alias("_kind"), "_length")  # fmt: skip


def continuation_links(
    successors: pl.DataFrame,
    candidates: pl.DataFrame,
    *,
    min_tokens: int,
    scope: str | None = None,
) -> pl.DataFrame:
    """``(turn_id, pred)``: the earlier turn of ``candidates`` each of ``successors`` continues
    (successors that continue none are left out). ``successors``: turn_id, prompt_token_ids,
    started_at; ``candidates``: turn_id, prompt_token_ids, response_token_ids, started_at (the
    successors may be among them). With ``scope``, a column of both, turns match only within
    the same value."""
    successors, candidates = _scoped(successors, scope), _scoped(candidates, scope)
    candidates = (
        candidates.select(_CANDIDATE)
        .with_columns(full_sequence("prompt_token_ids", "response_token_ids").alias("_full"))
        .filter(pl.col("_full").list.len() >= min_tokens)
    )
    lengths = candidates.select(
        "turn_id",
        SCOPE,
        pl.col("_full").list.len().cast(pl.Int64).alias("_full_len"),
        pl.col("prompt_token_ids").list.len().cast(pl.Int64).alias("_prompt_len"),
    )
    hashes = _prefix_hashes(candidates, "_full").join(lengths, on="turn_id", maintain_order="left")
    keys = (
        hashes.filter(pl.col("end") == pl.col("_full_len"))
        .select("turn_id", SCOPE, "end", "prefix_hash")
        .join(candidates.select("turn_id", "started_at", "_full"), on="turn_id")
        .rename({"turn_id": "pred", "started_at": "pred_started"})
        .sort("pred_started", "pred")
        .with_columns(pl.int_range(1, pl.len() + 1).over(_BUCKET).alias("pred_rank"))
    )
    offers = _offers(successors, candidates, hashes).filter(pl.col("end") >= min_tokens)
    earlier = _before(
        pl.col("pred_started"), pl.col("pred"), pl.col("started_at"), pl.col("turn_id")
    )
    exact = (
        _exact_matches(offers, keys, successors)
        .join(keys.select("pred", "pred_started"), on="pred")
        .filter(earlier)
    )
    tails = _tail_search(offers, hashes, keys, candidates, successors, exact)
    matches = pl.concat(
        [exact, tails.join(keys.select("pred", "pred_started"), on="pred").filter(earlier)]
    )
    best = (
        matches.sort("turn_id", "_kind", "_length", "end", "prefix_hash",
                     descending=[False, False, True, True, False])
        .group_by("turn_id", maintain_order=True)
        .first()
        .select("turn_id", *_BUCKET, "_kind", "_length")
    )  # fmt: skip
    return _assign(matches.join(best, on=["turn_id", *_BUCKET, "_kind", "_length"]))


def _assign(matches: pl.DataFrame) -> pl.DataFrame:
    """One predecessor per successor, each predecessor taken at most once.

    Successors of a bucket in start order each take the earliest free predecessor among the
    n_k started before them (n_k grows with k), so after k of them c_k = min(c_(k-1) + 1, n_k)
    are taken, i.e. c_k = k + min(0, min over j <= k of n_j - j). The k-th took predecessor
    c_k (in start order) if c_k grew; else none was free.
    """
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
    return matches.join(taken.select("turn_id", "pred_rank"), on=["turn_id", "pred_rank"]).select(
        "turn_id", "pred"
    )


def chain_roots(links: pl.DataFrame, turns: pl.Series) -> pl.DataFrame:
    """``(turn_id, root)``: the first turn of the chain of ``links`` (turn_id -> pred) each of
    ``turns`` is on (a turn without a link is its own root)."""
    chain = (
        pl.DataFrame({"turn_id": turns})
        .join(links.select("turn_id", "pred"), on="turn_id", how="left")
        .with_columns(pl.when(pl.col("pred").is_null()).then(pl.col("turn_id")).alias("root"))
    )
    for _ in range(_MAX_JUMPS):
        if chain["root"].null_count() == 0:
            break
        hop = chain.select(
            pl.col("turn_id").alias("pred"),
            pl.col("pred").alias("_pred2"),
            pl.col("root").alias("_root2"),
        )
        chain = (
            chain.join(hop, on="pred", how="left")
            .with_columns(
                pl.coalesce("root", "_root2").alias("root"), pl.col("_pred2").alias("pred")
            )
            .drop("_pred2", "_root2")
        )
    return chain.select("turn_id", "root")


def infer_trajectories(
    new: pl.DataFrame, known_tails: pl.DataFrame, *, min_tokens: int
) -> pl.DataFrame:
    """``(turn_id, trajectory_id)`` for every turn of ``new`` (turns with trajectory_id null).

    ``known_tails``: the last turn of each inferred trajectory already known (open or recently
    closed): turn_id, trajectory_id, prompt_token_ids, response_token_ids, started_at.
    """
    cols = ["turn_id", "prompt_token_ids", "response_token_ids", "started_at"]
    candidates = pl.concat([new.select(cols), known_tails.select(cols)])
    links = continuation_links(new.select(cols), candidates, min_tokens=min_tokens)
    known = known_tails.select("turn_id", "trajectory_id")
    roots = chain_roots(links, pl.concat([new["turn_id"], known["turn_id"]]))
    return (
        roots.join(new.select("turn_id"), on="turn_id")
        .join(known.rename({"turn_id": "root"}), on="root", how="left")
        .select(
            "turn_id",
            pl.coalesce("trajectory_id", pl.lit("inferred-") + pl.col("root")).alias(
                "trajectory_id"
            ),
        )
    )
