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
    whole = _resolve(pool, rebuilt)
    placed = rows.select("turn_id").join(whole, on="turn_id", how="left", maintain_order="left")
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


def _resolve(pool: pl.DataFrame, rebuilt: list[str]) -> pl.DataFrame:
    """``turn_id`` and the ``rebuilt`` columns whole, for every turn of ``pool``: first those
    stored whole, then, a link of the reference chains at a time, the turns referring to the
    ones just rebuilt."""
    referring = pl.col(REFERENCE).is_not_null()
    newest = pool.filter(~referring)
    parts, waiting = [newest], pool.filter(referring)
    while waiting.height:
        earlier = newest.select(
            pl.col("turn_id").alias(REFERENCE),
            *(pl.col(c).alias(f"_ref_{c}") for c in _reference_inputs(rebuilt)),
        )
        linked = waiting.join(earlier, on=REFERENCE)
        if linked.is_empty():
            raise BrokenReference(f"turns refer to turns not found: {_some(waiting)}")
        newest = _check(linked.with_columns(_rebuilt(rebuilt))).select(pool.columns)
        parts.append(newest)
        waiting = waiting.join(newest.select("turn_id"), on="turn_id", how="anti")
    return pl.concat(parts).select("turn_id", *rebuilt)


def _reference_inputs(rebuilt: list[str]) -> list[str]:
    return [*rebuilt, *(["response_token_ids"] if PROMPT in rebuilt else [])]


def _rebuilt(rebuilt: list[str]) -> list[pl.Expr]:
    exprs = []
    if PROMPT in rebuilt:
        empty = pl.lit([], dtype=pl.List(pl.Int32))
        sequence = pl.concat_list(
            f"_ref_{PROMPT}", pl.col("_ref_response_token_ids").fill_null(empty)
        )
        prefix = pl.col(PREFIX_LEN)
        exprs.append(
            pl.when(prefix.is_null())
            .then(pl.col(PROMPT))
            .otherwise(pl.concat_list(sequence.list.head(prefix), PROMPT))
            .alias(PROMPT)
        )
    for text in (name for name in TEXTS if name in rebuilt):
        shared, earlier = pl.col(f"{text}_shared"), pl.col(f"_ref_{text}")
        exprs.append(
            pl.when(shared.is_null())
            .then(pl.col(text))
            .otherwise(
                pl.concat_str(
                    earlier.str.head(shared.list.get(0)),
                    text,
                    earlier.str.tail(shared.list.get(1)),
                )
            )
            .alias(text)
        )
    return exprs


def _check(linked: pl.DataFrame) -> pl.DataFrame:
    """Rows whose rebuilt prompt has its stored length, and whose shared texts had an
    earlier text to come from; else ``BrokenReference``."""
    wrong = pl.lit(False)
    if PROMPT in linked.columns and PREFIX_LEN in linked.columns:
        rebuilt_len = pl.col(PROMPT).list.len()
        wrong = wrong | (
            pl.col(PREFIX_LEN).is_not_null()
            & (pl.col(PROMPT).is_null() | rebuilt_len.ne_missing(pl.col("prompt_len")))
        )
    for text in (name for name in TEXTS if f"{name}_shared" in linked.columns):
        wrong = wrong | (pl.col(f"{text}_shared").is_not_null() & pl.col(text).is_null())
    broken = linked.filter(wrong)
    if broken.height:
        raise BrokenReference(f"rebuilt prompts differ from their stored length: {_some(broken)}")
    return linked


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
