"""Whole prompts and request texts of turns stored as differences from an earlier turn.

The proxy stores a turn's prompt IDs and request texts as what they add to its trajectory's
previous call (``capture.prompt_prefixes``): ``prompt_prefix_turn_id`` names that call,
``prompt_prefix_len`` says how many of its prompt + response IDs this prompt starts with, and
each ``<text>_shared`` how many characters of its text this one's starts and ends with. Every
reader of those columns goes through ``with_whole_prompts``, which follows the references back
to turns stored whole, reading only the referring trajectories' earlier turns, and proves each
rebuilt prompt by its stored length (``prompt_len``). Rows stored whole (all rows written before
the references existed) read as they are.
"""

from __future__ import annotations

from typing import TypeVar

import polars as pl

REFERENCE = "prompt_prefix_turn_id"
PREFIX_LEN = "prompt_prefix_len"
PROMPT = "prompt_token_ids"
TEXTS = ("request_messages", "request_tools", "api_request")
STORED_COLUMNS = (PROMPT, *TEXTS)
"""The columns a turn may store as a difference."""

_INPUTS = {
    PROMPT: [PROMPT, PREFIX_LEN, "prompt_len", "response_token_ids"],
    **{text: [text, f"{text}_shared"] for text in TEXTS},
}


Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


class BrokenReference(RuntimeError):
    """A turn whose referenced turn cannot be found, or whose rebuilt prompt is not its length:
    readers never get an inexact prompt."""


def read_columns(columns: list[str], available: list[str]) -> list[str]:
    """``columns`` and what rebuilding them needs, among a ``turns`` table's ``available``."""
    if REFERENCE not in available:
        return columns
    extra = ["turn_id", "trajectory_id", "started_at", REFERENCE]
    for name in columns:
        extra += _INPUTS.get(name, [])
    return list(dict.fromkeys([*columns, *(c for c in extra if c in available)]))


def with_whole_prompts(
    rows: pl.DataFrame, landed: pl.LazyFrame | pl.DataFrame | None
) -> pl.DataFrame:
    """``rows`` of ``turns`` (read with ``read_columns``) with their stored columns whole.

    Referenced turns missing from ``rows`` are read from ``landed``: the earlier turns of the
    referring rows' trajectories. Raises ``BrokenReference`` rather than return an inexact
    value."""
    rebuilt = [name for name in STORED_COLUMNS if name in rows.columns]
    if REFERENCE not in rows.columns or not rebuilt or rows.get_column(REFERENCE).is_null().all():
        return rows
    inputs = ["turn_id", REFERENCE, *(c for name in rebuilt for c in _INPUTS[name])]
    own = rows.select(
        pl.col(c) if c in rows.columns else pl.lit(None, pl.List(pl.Int32)).alias(c) for c in inputs
    )
    chain = _earlier_turns(rows, landed, inputs)
    pool = own if chain.is_empty() else pl.concat([chain, own], how="vertical_relaxed")
    pool = pool.unique("turn_id", keep="first", maintain_order=True)
    wanted = rows.get_column("turn_id").unique()
    placed = rows.select("turn_id")
    for name in rebuilt:
        whole = _whole_column(pool, name, wanted)
        placed = placed.join(whole, on="turn_id", how="left", maintain_order="left")
    return rows.with_columns(placed.get_column(name) for name in rebuilt)


def _earlier_turns(
    rows: pl.DataFrame, landed: pl.LazyFrame | pl.DataFrame | None, inputs: list[str]
) -> pl.DataFrame:
    """The turns of the referring rows' trajectories that started no later than the last of
    them: a reference names an earlier turn of the same trajectory."""
    referring = rows.filter(pl.col(REFERENCE).is_not_null())
    missing = referring.join(
        rows.select("turn_id"), left_on=REFERENCE, right_on="turn_id", how="anti"
    )
    if missing.is_empty() or landed is None:
        return pl.DataFrame()
    if "response_token_ids" in inputs and "response_token_ids" not in rows.columns:
        missing = referring  # the rows read no responses, which the prompts need
    trajectories = missing.get_column("trajectory_id").drop_nulls().unique().implode()
    return (
        landed.lazy()
        .filter(
            (pl.col("started_at") <= missing.get_column("started_at").max())
            & pl.col("trajectory_id").is_in(trajectories)
        )
        .select(inputs)
        .collect()
    )


_PIECE = ["owner", "position", "source", "kind", "start", "length"]
"""A stretch of a turn's whole value: ``length`` items from ``start`` of the stored value of
turn ``source`` (``kind`` 1: its response IDs), the ``position``-th of turn ``owner``'s."""


def _whole_column(pool: pl.DataFrame, name: str, wanted: pl.Series) -> pl.DataFrame:
    """``turn_id`` and ``name`` whole for the ``wanted`` turns of ``pool``.

    The references are followed a link of the chains at a time on the pieces each whole value
    is made of (narrow rows), so only the wanted values are put together: a trajectory's last
    prompt costs its own tokens, not those of every prompt before it."""
    prompt = name == PROMPT
    spec = PREFIX_LEN if prompt else f"{name}_shared"
    size = pl.col(name).list.len() if prompt else pl.col(name).str.len_chars()
    turns = pool.select(
        "turn_id",
        REFERENCE,
        spec,
        size.fill_null(0).alias("_stored"),
        *(
            [pl.col("response_token_ids").list.len().fill_null(0).alias("_response")]
            if prompt
            else []
        ),
        *([pl.col("prompt_len")] if prompt else []),
    )
    referring = pl.col(spec).is_not_null()
    newest = _own_piece(turns.filter(~referring), 0)
    kept, waiting = [], turns.filter(referring)
    while waiting.height:
        linked = waiting.join(
            newest.select(pl.col("owner").alias(REFERENCE)).unique(), on=REFERENCE
        )
        if linked.is_empty():
            raise BrokenReference(f"turns refer to turns not found: {_some(waiting)}")
        newest = _linked_pieces(linked, newest, turns, spec, prompt)
        kept.append(newest.join(wanted.to_frame("owner"), on="owner", how="semi"))
        waiting = waiting.join(linked.select("turn_id"), on="turn_id", how="anti")
    stored = pool.join(wanted.to_frame("turn_id"), on="turn_id", how="semi")
    whole = stored.filter(pl.col(spec).is_null()).select("turn_id", name)
    if kept:
        whole = pl.concat([whole, _assembled(pl.concat(kept), pool, turns, name, prompt)])
    return whole


def _own_piece(turns: Frame, part: int) -> Frame:
    """Each turn's stored value as one piece, in ``part`` of its value."""
    return turns.select(
        pl.col("turn_id").alias("owner"),
        pl.lit(part, pl.Int64).alias("position"),
        pl.col("turn_id").alias("source"),
        pl.lit(0, pl.Int8).alias("kind"),
        pl.lit(0, pl.Int64).alias("start"),
        pl.col("_stored").cast(pl.Int64).alias("length"),
    )


def _linked_pieces(
    linked: pl.DataFrame, earlier: pl.DataFrame, turns: pl.DataFrame, spec: str, prompt: bool
) -> pl.DataFrame:
    """The pieces of the ``linked`` turns: the stretches of their referenced turn's value
    (``earlier``'s pieces; for a prompt, its pieces and then its response) they share, and
    their own stored piece between the head and the tail they share. One lazy plan: a chain
    is as many links as its trajectory has calls."""
    linked, earlier = linked.lazy(), earlier.lazy()
    if prompt:
        responses = turns.lazy().join(
            linked.select(pl.col(REFERENCE).alias("turn_id")).unique(), on="turn_id"
        )
        earlier = pl.concat([earlier, _response_piece(responses)])
    length = pl.col("length")
    offsets = earlier.sort("owner", "position").with_columns(
        (length.cum_sum().over("owner") - length).alias("_at"),
        length.sum().over("owner").alias("_total"),
    )
    if prompt:
        ranges = linked.select(
            "turn_id", REFERENCE, pl.col(spec).alias("_head"), pl.lit(0).alias("_tail")
        )
    else:
        ranges = linked.select(
            "turn_id",
            REFERENCE,
            pl.col(spec).list.get(0).alias("_head"),
            pl.col(spec).list.get(1).alias("_tail"),
        )
    shared = ranges.join(offsets, left_on=REFERENCE, right_on="owner")
    head = _clipped(shared, pl.lit(0), pl.col("_head"), 0)
    tail = _clipped(shared, pl.col("_total") - pl.col("_tail"), pl.col("_total"), 2)
    own = _own_piece(linked, 1).with_columns(pl.lit(0, pl.Int64).alias("_order"))
    pieces = (
        pl.concat([head, own, tail])
        .sort("owner", "position", "_order")
        .with_columns(pl.int_range(pl.len()).over("owner").cast(pl.Int64).alias("position"))
        .select(_PIECE)
    )
    pieces, broken = pl.collect_all([pieces, _broken(pieces, linked, ranges, prompt)])
    if broken.height:
        raise BrokenReference(f"rebuilt prompts differ from their stored length: {_some(broken)}")
    return pieces


def _response_piece(turns: pl.LazyFrame) -> pl.LazyFrame:
    return turns.select(
        pl.col("turn_id").alias("owner"),
        pl.lit(2**40, pl.Int64).alias("position"),
        pl.col("turn_id").alias("source"),
        pl.lit(1, pl.Int8).alias("kind"),
        pl.lit(0, pl.Int64).alias("start"),
        pl.col("_response").cast(pl.Int64).alias("length"),
    )


def _clipped(shared: pl.LazyFrame, begin: pl.Expr, end: pl.Expr, part: int) -> pl.LazyFrame:
    """The parts of the referenced turns' pieces within ``[begin, end)`` of its value, as
    pieces of the referring turn, in ``part`` of its value (0 head, 2 tail; its own is 1)."""
    at, length = pl.col("_at"), pl.col("length")
    low, high = pl.max_horizontal(at, begin), pl.min_horizontal(at + length, end)
    return shared.filter(high > low).select(
        pl.col("turn_id").alias("owner"),
        pl.lit(part, pl.Int64).alias("position"),
        "source",
        "kind",
        (pl.col("start") + low - at).alias("start"),
        (high - low).alias("length"),
        pl.col("position").alias("_order"),
    )


def _broken(
    pieces: pl.LazyFrame, linked: pl.LazyFrame, ranges: pl.LazyFrame, prompt: bool
) -> pl.LazyFrame:
    """The linked turns whose pieces do not add up to their whole length (a prompt's is
    stored as ``prompt_len``): a referenced value shorter than what they share."""
    expected = ranges.join(
        linked.select("turn_id", "_stored", *(["prompt_len"] if prompt else [])), on="turn_id"
    )
    total = pl.col("_sum").fill_null(0)
    whole = pl.col("prompt_len") if prompt else total
    sums = pieces.group_by("owner").agg(pl.col("length").sum().alias("_sum"))
    return expected.join(sums, left_on="turn_id", right_on="owner", how="left").filter(
        total.ne_missing(pl.col("_head") + pl.col("_stored") + pl.col("_tail"))
        | total.ne_missing(whole)
    )


def _assembled(
    pieces: pl.DataFrame, pool: pl.DataFrame, turns: pl.DataFrame, name: str, prompt: bool
) -> pl.DataFrame:
    """The wanted turns' values put together from their pieces, in order."""
    values = pool.select(
        pl.col("turn_id").alias("source"), name, *(["response_token_ids"] if prompt else [])
    )
    joined = pieces.join(values, on="source", how="left").sort("owner", "position")
    if prompt:
        value = pl.when(pl.col("kind") == 1).then("response_token_ids").otherwise(name)
        piece = value.list.slice(pl.col("start"), pl.col("length"))
        whole = piece.list.explode(keep_nulls=False, empty_as_null=False)
    else:
        whole = pl.col(name).str.slice(pl.col("start"), pl.col("length")).str.join("")
    return (
        joined.group_by("owner", maintain_order=True)
        .agg(whole.alias(name))
        .rename({"owner": "turn_id"})
    )


def _some(frame: pl.DataFrame) -> str:
    return ", ".join(frame.get_column("turn_id").head(3).to_list())


def prompt_additions(turns: pl.LazyFrame) -> pl.LazyFrame:
    """Per turn what its prompt adds, without rebuilding anything: the IDs after the first
    ``prompt_prefix_len`` of the referenced turn's prompt + response (``prompt_prefix_turn_id``),
    or, where the prompt is stored whole, all of it (``prompt_prefix_len`` null)."""
    columns = turns.collect_schema().names()
    if REFERENCE not in columns:
        turns = turns.with_columns(
            pl.lit(None, pl.String).alias(REFERENCE), pl.lit(None, pl.Int32).alias(PREFIX_LEN)
        )
    return turns.select("turn_id", REFERENCE, PREFIX_LEN, pl.col(PROMPT).alias("added_token_ids"))


def whole_turns(turns: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """All of ``turns`` with its stored columns whole, for a table small enough to read at
    once (tests, tools); readers of some turns go through ``with_whole_prompts``."""
    frame = turns.lazy().collect()
    return with_whole_prompts(frame, frame)
