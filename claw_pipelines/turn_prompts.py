"""Whole prompts and request texts of turns stored as differences from an earlier turn.

The proxy stores a turn's prompt IDs and request texts as what they add to its trajectory's
previous call (``capture.prompt_prefixes``): ``prompt_prefix_turn_id`` names that call,
``prompt_prefix_len`` says how many of its prompt + response IDs this prompt starts with, and
each ``<text>_shared`` how many characters of its text this one's starts and ends with. Every
reader of those columns goes through ``with_whole_prompts`` (or ``whole_prompts`` for the few
prompts a reader of stored rows needs whole: the step extractor), which follows the references
back to turns stored whole, reading only the referring trajectories' earlier turns, and proves
each rebuilt prompt by its stored length (``prompt_len``). Rows stored whole (all rows written
before the references existed) read as they are.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl

REFERENCE = "prompt_prefix_turn_id"
PREFIX_LEN = "prompt_prefix_len"
PROMPT = "prompt_token_ids"
PROMPT_LEN = "prompt_len"
PROMPT_REFERENCE = (REFERENCE, PREFIX_LEN, PROMPT_LEN)
"""The columns that say what a stored prompt refers to, and how long it is whole."""
TEXTS = ("request_messages", "request_tools", "api_request")
STORED_COLUMNS = (PROMPT, *TEXTS)
"""The columns a turn may store as a difference."""
_SHARE = {PROMPT: PREFIX_LEN, **{text: f"{text}_shared" for text in TEXTS}}
"""The column that says how much of each stored column a turn shares with its reference."""

_INPUTS = {
    PROMPT: [PROMPT, PREFIX_LEN, "prompt_len", "response_token_ids"],
    **{text: [text, f"{text}_shared"] for text in TEXTS},
}


LOOKBACK = timedelta(seconds=30)
"""How far before the earliest referring row the first read of earlier turns reaches (an
agent's calls come seconds apart); each read that leaves a reference unresolved reaches
``WIDEN`` times as far, and after ``READS`` reads (three months back) the rest of the table is
read: a trajectory that ran for longer, or a broken reference."""
WIDEN = 8
READS = 7


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
    """``rows`` of ``turns`` (read with ``read_columns``) with their stored columns whole, and
    those columns' shares (``prompt_prefix_len``, ``<text>_shared``) null, as for a turn stored
    whole: a reader given these rows never applies a reference twice. ``prompt_prefix_turn_id``
    still names the turn it extended.

    Referenced turns missing from ``rows`` are read from ``landed``: the earlier turns of the
    referring rows' trajectories. Raises ``BrokenReference`` rather than return an inexact
    value."""
    rebuilt = [name for name in STORED_COLUMNS if name in rows.columns]
    if REFERENCE not in rows.columns or not rebuilt or rows.get_column(REFERENCE).is_null().all():
        return rows
    pool = _pool(rows, landed, rebuilt)
    wanted = rows.get_column("turn_id").unique()
    placed = rows.select("turn_id")
    for name in rebuilt:
        whole = _whole_column(pool, name, wanted)
        placed = placed.join(whole, on="turn_id", how="left", maintain_order="left")
    shares = [_SHARE[name] for name in rebuilt if _SHARE[name] in rows.columns]
    return rows.with_columns(
        *(placed.get_column(name) for name in rebuilt),
        *(pl.lit(None, rows.schema[share]).alias(share) for share in shares),
    )


def whole_prompts(
    rows: pl.DataFrame, wanted: pl.Series, landed: pl.LazyFrame | pl.DataFrame | None
) -> pl.DataFrame:
    """``turn_id`` and whole ``prompt_token_ids`` of the ``wanted`` turns of ``rows`` (turns
    with their prompts as stored and ``PROMPT_REFERENCE``), for a reader that needs a few
    prompts whole among many it keeps as stored. Only the wanted turns' trajectories are
    followed back (through ``rows``, else ``landed``); ``BrokenReference`` as
    ``with_whole_prompts``."""
    trajectories = rows.filter(pl.col("turn_id").is_in(wanted.implode())).get_column(
        "trajectory_id"
    )
    own = rows.filter(
        pl.col("trajectory_id").is_in(trajectories.drop_nulls().implode())
        | pl.col("turn_id").is_in(wanted.implode())
    )
    return _whole_column(_pool(own, landed, [PROMPT]), PROMPT, wanted)


def _pool(
    rows: pl.DataFrame, landed: pl.LazyFrame | pl.DataFrame | None, rebuilt: list[str]
) -> pl.DataFrame:
    """What rebuilding ``rebuilt`` of ``rows`` needs: their inputs and those of the earlier
    turns of their trajectories that ``rows`` lacks (read from ``landed``), once per turn."""
    inputs = ["turn_id", REFERENCE, *(c for name in rebuilt for c in _INPUTS[name])]
    own = rows.select(
        pl.col(c) if c in rows.columns else pl.lit(None, pl.List(pl.Int32)).alias(c) for c in inputs
    )
    chain = _earlier_turns(rows, landed, inputs)
    pool = own if chain.is_empty() else pl.concat([chain, own], how="vertical_relaxed")
    return pool.unique("turn_id", keep="first", maintain_order=True)


def _earlier_turns(
    rows: pl.DataFrame, landed: pl.LazyFrame | pl.DataFrame | None, inputs: list[str]
) -> pl.DataFrame:
    """The turns of the referring rows' trajectories that started no later than the last of
    them: a reference names an earlier turn of the same trajectory. They are read in windows
    reaching further back until every reference resolves (``LOOKBACK``), so the read follows
    the trajectories' age, not the table's: reading back to the table's start, each export of
    a soak's batches slowed as ``turns`` grew."""
    referring = rows.filter(pl.col(REFERENCE).is_not_null())
    missing = referring.join(
        rows.select("turn_id"), left_on=REFERENCE, right_on="turn_id", how="anti"
    )
    known = rows.get_column("turn_id")
    if "response_token_ids" in inputs and "response_token_ids" not in rows.columns:
        missing = referring  # the rows read no responses, which the prompts need
        known = known.clear()  # so a referenced row counts only once read with its response
    if missing.is_empty() or landed is None:
        return pl.DataFrame()
    trajectories = missing.get_column("trajectory_id").drop_nulls().unique().implode()
    started = missing.get_column("started_at")
    own = (pl.col("started_at") <= started.max()) & pl.col("trajectory_id").is_in(trajectories)
    reach = LOOKBACK
    for _ in range(READS):
        earlier = _read(landed, own & (pl.col("started_at") >= started.min() - reach), inputs)
        references = pl.concat([rows.get_column(REFERENCE), earlier.get_column(REFERENCE)])
        if _resolved(references, pl.concat([known, earlier.get_column("turn_id")])):
            return earlier
        reach *= WIDEN
    return _read(landed, own, inputs)


def _read(landed: pl.LazyFrame | pl.DataFrame, where: pl.Expr, inputs: list[str]) -> pl.DataFrame:
    return landed.lazy().filter(where).select(inputs).collect()


def _resolved(references: pl.Series, turn_ids: pl.Series) -> bool:
    """Whether every one of ``references`` names one of ``turn_ids``."""
    return references.drop_nulls().is_in(turn_ids.implode()).all()


ANCHOR = 2
"""``kind`` of a piece that is a stretch of the owner's anchor's whole value (not yet known);
0 and 1 are a stored value and a response."""


def _whole_column(pool: pl.DataFrame, name: str, wanted: pl.Series) -> pl.DataFrame:
    """``turn_id`` and ``name`` whole for the ``wanted`` turns of ``pool``.

    Each value is a list of pieces (narrow rows): stretches of stored values and of the value
    of an earlier turn, its anchor, at first the turn it refers to. Each round replaces the
    anchor's stretches by the anchor's own pieces, so the anchors jump twice as far back each
    round (a 100-call chain in 7 rounds) until they are turns stored whole; then only the
    wanted values are put together."""
    prompt = name == PROMPT
    spec = PREFIX_LEN if prompt else f"{name}_shared"
    turns = _lengths(pool, name, spec, prompt)
    pieces = _first_pieces(turns, spec, prompt)
    anchors = turns.select("turn_id", pl.col(REFERENCE).alias("_anchor"))
    roots = turns.filter(pl.col(REFERENCE).is_null()).select("turn_id")
    lost = anchors.filter(pl.col("_anchor").is_not_null()).join(
        anchors.select(pl.col("turn_id").alias("_anchor")), on="_anchor", how="anti"
    )
    if lost.height:
        raise BrokenReference(f"turns refer to turns not found: {_some(lost)}")
    while True:
        jumping = anchors.join(roots.rename({"turn_id": "_anchor"}), on="_anchor", how="anti")
        jumping = jumping.filter(pl.col("_anchor").is_not_null())
        if jumping.is_empty():
            break
        pieces = _jumped(pieces, jumping)
        further = jumping.join(
            anchors.rename({"turn_id": "_anchor", "_anchor": "_next"}), on="_anchor"
        )
        anchors = anchors.join(further.select("turn_id", "_next"), on="turn_id", how="left")
        anchors = anchors.select("turn_id", pl.coalesce("_next", "_anchor").alias("_anchor"))
    mine = pieces.join(wanted.to_frame("owner"), on="owner", how="semi")
    rooted = mine.join(anchors.rename({"turn_id": "owner"}), on="owner", how="left")
    literal = rooted.with_columns(
        pl.when(pl.col("kind") == ANCHOR).then("_anchor").otherwise("source").alias("source"),
        pl.when(pl.col("kind") == ANCHOR).then(0).otherwise("kind").cast(pl.Int8).alias("kind"),
    )
    stored = pool.join(wanted.to_frame("turn_id"), on="turn_id", how="semi")
    whole = stored.filter(pl.col(spec).is_null()).select("turn_id", name)
    referring = literal.join(whole.select(pl.col("turn_id").alias("owner")), on="owner", how="anti")
    if referring.height:
        assembled = _assembled(referring, pool, name, prompt)
        whole = pl.concat([whole, _proven(assembled, turns, name, prompt)])
    return whole


def _lengths(pool: pl.DataFrame, name: str, spec: str, prompt: bool) -> pl.DataFrame:
    """Per turn, what its pieces are made of: its reference, the shared ``_head`` and
    ``_tail``, the stored length and the whole one (its referrers' tails end there)."""
    stored = (pl.col(name).list.len() if prompt else pl.col(name).str.len_chars()).fill_null(0)
    if prompt:
        head, tail = pl.col(spec), pl.lit(0)
        whole = pl.coalesce("prompt_len", stored)
    else:
        head, tail = pl.col(spec).list.get(0), pl.col(spec).list.get(1)
        whole = pl.when(pl.col(spec).is_null()).then(stored).otherwise(head + stored + tail)
    return pool.select(
        "turn_id",
        pl.when(pl.col(spec).is_not_null()).then(REFERENCE).alias(REFERENCE),
        head.cast(pl.Int64).alias("_head"),
        tail.cast(pl.Int64).alias("_tail"),
        stored.cast(pl.Int64).alias("_stored"),
        whole.cast(pl.Int64).alias("_whole"),
    )


def _piece(owner: str, source: str, kind: int | pl.Expr, start: pl.Expr, length: pl.Expr) -> list:
    return [
        pl.col(owner).alias("owner"),
        pl.col(source).alias("source"),
        (kind if isinstance(kind, pl.Expr) else pl.lit(kind)).cast(pl.Int8).alias("kind"),
        start.cast(pl.Int64).alias("start"),
        length.cast(pl.Int64).alias("length"),
    ]


def _first_pieces(turns: pl.DataFrame, spec: str, prompt: bool) -> pl.DataFrame:
    """Each turn's value as pieces around its own stored value: the head it shares with the
    turn it refers to (for a prompt, the part beyond that turn's prompt is its response), its
    stored value, the tail it shares."""
    earlier = turns.select(
        pl.col("turn_id").alias(REFERENCE),
        pl.col("_whole").alias("_ref_whole"),
    )
    linked = turns.join(earlier, on=REFERENCE, how="left")
    referring = pl.col(REFERENCE).is_not_null()
    head = pl.min_horizontal("_head", "_ref_whole") if prompt else pl.col("_head")
    parts = [
        linked.filter(referring).select(*_piece("turn_id", REFERENCE, ANCHOR, pl.lit(0), head)),
        linked.select(*_piece("turn_id", "turn_id", 0, pl.lit(0), pl.col("_stored"))),
        linked.filter(referring).select(
            *_piece(
                "turn_id",
                REFERENCE,
                ANCHOR,
                pl.col("_ref_whole") - pl.col("_tail"),
                pl.col("_tail"),
            )
        ),
    ]
    if prompt:
        beyond = pl.col("_head") - pl.col("_ref_whole")
        parts.insert(
            1,
            linked.filter(referring & (beyond > 0)).select(
                *_piece("turn_id", REFERENCE, 1, pl.lit(0), beyond)
            ),
        )
    numbered = [
        part.with_columns(pl.lit(index, pl.Int64).alias("position"))
        for index, part in enumerate(parts)
    ]
    return pl.concat(numbered).filter(pl.col("length") > 0).select(_PIECE)


_PIECE = ["owner", "position", "source", "kind", "start", "length"]
"""A stretch of a turn's whole value, its ``position``-th: ``length`` items from ``start`` of
the stored value of turn ``source`` (``kind`` 0), its response (1) or, with ``kind`` ``ANCHOR``,
the whole value of the owner's anchor."""


def _jumped(pieces: pl.DataFrame, jumping: pl.DataFrame) -> pl.DataFrame:
    """``pieces`` with the anchor stretches of the ``jumping`` turns (turn_id, _anchor)
    replaced by the parts of their anchor's pieces they cover."""
    length = pl.col("length")
    anchor_pieces = pieces.sort("owner", "position").with_columns(
        (length.cum_sum().over("owner") - length).alias("_at")
    )
    on_anchor = (pl.col("kind") == ANCHOR) & pl.col("owner").is_in(
        jumping.get_column("turn_id").implode()
    )
    replaced = (
        pieces.filter(on_anchor)
        .join(jumping.rename({"turn_id": "owner"}), on="owner")
        .join(anchor_pieces, left_on="_anchor", right_on="owner", suffix="_a")
    )
    at, begin = pl.col("_at"), pl.col("start")
    low = pl.max_horizontal(at, begin)
    high = pl.min_horizontal(at + pl.col("length_a"), begin + length)
    inner = replaced.filter(high > low).select(
        "owner",
        "position",
        pl.col("position_a").alias("_inner"),
        pl.col("source_a").alias("source"),
        pl.col("kind_a").alias("kind"),
        (pl.col("start_a") + low - at).alias("start"),
        (high - low).alias("length"),
    )
    kept = pieces.filter(~on_anchor).with_columns(pl.lit(0, pl.Int64).alias("_inner"))
    return (
        pl.concat([kept, inner.select(kept.columns)])
        .sort("owner", "position", "_inner")
        .with_columns(pl.int_range(pl.len()).over("owner").cast(pl.Int64).alias("position"))
        .select(_PIECE)
    )


def _proven(assembled: pl.DataFrame, turns: pl.DataFrame, name: str, prompt: bool) -> pl.DataFrame:
    """``assembled`` when every value has its whole length (a prompt's is stored as
    ``prompt_len``); else ``BrokenReference``: what a turn shares was not all there."""
    size = pl.col(name).list.len() if prompt else pl.col(name).str.len_chars()
    broken = assembled.join(turns, on="turn_id").filter(size.ne_missing(pl.col("_whole")))
    if broken.height:
        raise BrokenReference(f"rebuilt prompts differ from their stored length: {_some(broken)}")
    return assembled


def _assembled(pieces: pl.DataFrame, pool: pl.DataFrame, name: str, prompt: bool) -> pl.DataFrame:
    """The values put together from their pieces, in order."""
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
