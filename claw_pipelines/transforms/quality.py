"""Quality scoring of rewarded steps: a score in [0, 1] and the reasons that lowered it.

Each signal is a boolean polars expression on a step; a step's score is
``clip(1 - sum(weight of each tripped signal), 0, 1)`` and ``quality_reasons`` names the tripped
signals, so a curator sees why a step scored low and a recipe can filter on the score.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

from claw_pipelines.derived_schemas import (
    SCORED_STEPS,
    SIGNAL_COLUMNS,
    fit,
    with_turn_columns,
)
from claw_pipelines.schemas import polars_schema
from claw_pipelines.transforms.messages import malformed_tool_calls, tool_call_count

RESPONSE_COLUMNS = ["response_token_ids", "response_logprobs", "response_message", "response_text"]
"""The turn columns the signals read: the reply's tokens and message (prompt ids, the bulk of
a step, are not needed)."""


class QualityWeights(BaseModel):
    """How much each signal lowers the score (0 disables it; a negative weight would raise it)."""

    model_config = ConfigDict(extra="forbid")

    not_engine_tokens: NonNegativeFloat = 0.5
    logprobs_missing: NonNegativeFloat = 0.2
    logprobs_misaligned: NonNegativeFloat = 0.5
    truncated: NonNegativeFloat = 0.2
    empty_response: NonNegativeFloat = 0.8
    repetitive: NonNegativeFloat = 0.4
    malformed_tool_call: NonNegativeFloat = 0.4
    error: NonNegativeFloat = 0.8
    prefix_break: NonNegativeFloat = 0.1
    stale: NonNegativeFloat = 0.2
    length_outlier: NonNegativeFloat = 0.1
    aborted: NonNegativeFloat = 0.6


class QualityConfig(BaseModel):
    """Signal weights and thresholds (assets/quality.yaml). A step's score is
    ``max(0, 1 - sum(weights of the signals it trips))``."""

    model_config = ConfigDict(extra="forbid")

    weights: QualityWeights = QualityWeights()
    repetition_ngram: int = Field(default=4, ge=1, description="n of the repeated n-gram ratio.")
    repetition_threshold: float = Field(
        default=0.5, ge=0, le=1, description="Share of repeated n-grams that trips 'repetitive'."
    )
    max_policy_lag: int = Field(default=4, ge=0, description="Versions behind the latest = stale.")
    length_z: float = Field(default=3.0, gt=0, description="|z| of response length = outlier.")
    length_min_population: int = Field(
        default=20, ge=2, description="Fewer steps than this: no length statistics, no outliers."
    )

    @classmethod
    def from_yaml(cls, path: str | Path) -> QualityConfig:
        """With libyaml's loader: PyYAML's own took 2-4 ms of each run (a process) reading it."""
        return cls.model_validate(yaml.load(Path(path).read_text(), yaml.CSafeLoader) or {})


_MARK = np.uint64(1 << 63)
"""Set in the keys of the windows that cross a sequence's end, never in an n-gram's."""
_ALL = (1 << 64) - 1


def repeated_ngram_ratio(tokens: pl.Series, n: int) -> pl.Series:
    """Per sequence, the share of its n-grams that repeat an earlier one (0 when shorter than n).

    Each n-gram becomes one 64-bit key and each sequence a list of its keys, whose distinct
    values ``list.n_unique`` counts: the token ids stay in one flat array, with no exploded
    frame, shifted columns or struct hashing (the six chunks of the 100k-turn bench build,
    256-token responses, n = 4: 1.0-1.2 -> 0.6-0.65 CPU s; a 20k call's peak memory 302 ->
    175 MiB).

    A key packs the n ids exactly when n of them fit in 63 bits (the batch's id range
    decides: 3-grams of a 150k vocabulary, 4-grams of a 32k one); else (``_keys``) two
    different n-grams of one sequence share a key with probability ~2^-63 (all pairs of a
    256-token response's 4-grams together ~4e-15), which would count one repeat too many.
    """
    lengths = tokens.list.len().fill_null(0).cast(pl.Int64)
    ids = tokens.drop_nulls().list.explode(empty_as_null=False)
    if len(ids) < n:
        return pl.Series(tokens.name, [0.0] * len(tokens), dtype=pl.Float64)
    if ids.dtype == pl.UInt64:  # wrapped into Int64: still one code per id
        ids = ids.cast(pl.Int64, wrap_numerical=True)
    low, high = ids.min() or 0, ids.max() or 0  # (None: every id is null)
    bits = (high - low + 1).bit_length()
    codes = _codes(ids, low, null=high - low + 1)
    buffer, keys = _keys(codes, n, bits)
    ends = lengths.cum_sum().to_numpy()
    for back in range(1, n):  # the last n - 1 windows of a sequence cross its end
        crossing = ends[lengths.to_numpy() >= back] - back
        keys[crossing] = _MARK | np.uint64(back)
    offsets = np.concatenate([[0], ends])  # (pa.array of an ndarray would import pandas)
    grams = pa.LargeListArray.from_arrays(
        pa.Array.from_buffers(pa.int64(), len(offsets), [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(pa.uint64(), len(keys), [None, buffer]),
    )
    width = lengths - (n - 1)
    distinct = pl.Series(grams).list.n_unique() - lengths.clip(upper_bound=n - 1)
    return (
        pl.select(pl.when(width > 0).then(1 - distinct / width).otherwise(0.0))
        .to_series()
        .alias(tokens.name)
    )


def _scratch(length: int) -> tuple[pa.Buffer, np.ndarray]:
    """A writable uint64 array from Arrow's memory pool, which keeps freed memory for the next
    call: numpy's own large arrays are fresh pages each time, and first-touch page faults cost
    more than the arithmetic on them (~0.03 s per 40 MB here)."""
    buffer = pa.allocate_buffer(length * 8)
    return buffer, np.frombuffer(buffer, np.uint64)


def _codes(ids: pl.Series, low: int, *, null: int) -> np.ndarray:
    """``ids - low`` (``null`` for a null id) as uint64, chunk by chunk (a multi-chunk
    ``to_numpy`` copies). Ids spanning all 64 bits wrap: then a null shares ``low``'s code."""
    _, codes = _scratch(len(ids))
    start = 0
    for chunk in ids.fill_null(low).get_chunks():
        window = codes[start : start + len(chunk)].view(np.int64)
        np.subtract(chunk.to_numpy(), np.int64(low), out=window)
        start += len(chunk)
    if ids.null_count():
        codes[ids.is_null().to_numpy()] = np.uint64(null & _ALL)
    return codes


def _keys(codes: np.ndarray, n: int, bits: int) -> tuple[pa.Buffer, np.ndarray]:
    """Per position, the key of the n codes from it (``bits`` each), in one array; the last
    n - 1 positions hold anything, for the caller to mark.

    The codes are packed exactly in groups that fit in 63 bits (all n when they do; the first
    group takes the remainder): a group is xor-ed onto a mix of the ones before it (murmur3's
    64-bit finalizer, a bijection), and the top bit is cleared. N-grams that differ only in the
    last group keep different keys; others collide only where the mixes happen to differ by
    the two groups' exact xor."""
    per_group = max(63 // bits, 1)
    sizes = [n % per_group or per_group] + [per_group] * ((n - 1) // per_group)
    buffer, keys = _scratch(len(codes))
    windows = keys[: len(codes) - (n - 1)]
    _pack(windows, codes, 0, sizes[0], bits)
    if len(sizes) > 1 or bits > 63:
        _, spare = _scratch(len(windows))
        first = sizes[0]
        for size in sizes[1:]:
            _mix(windows, spare)
            windows ^= _pack(spare, codes, first, size, bits)
            first += size
        if bits > 63:  # one id per group, the first one unmixed
            _mix(windows, spare)
        windows &= ~_MARK
    return buffer, keys


def _pack(into: np.ndarray, codes: np.ndarray, first: int, size: int, bits: int) -> np.ndarray:
    """``into``, per position, the ``size`` codes from ``first`` on, ``bits`` each."""
    into[:] = codes[first : first + len(into)]
    for i in range(first + 1, first + size):
        into <<= np.uint64(bits)
        into |= codes[i : i + len(into)]
    return into


def _mix(values: np.ndarray, spare: np.ndarray) -> None:
    """murmur3's 64-bit finalizer, in place (``spare``: an array of the same length)."""
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, None):
        np.right_shift(values, np.uint64(33), out=spare)
        values ^= spare
        if multiplier is not None:
            values *= np.uint64(multiplier)


def token_signals(steps: pl.DataFrame, ngram: int) -> pl.DataFrame:
    """``steps`` (with their ``RESPONSE_COLUMNS``) plus ``SIGNAL_COLUMNS``: what the token
    and reply signals need, so scoring can run on narrow rows."""
    return steps.with_columns(
        pl.col("response_logprobs").list.len().cast(pl.Int32).alias("logprobs_len"),
        pl.lit(ngram, pl.Int32).alias("repetition_ngram"),
        repeated_ngram_ratio(steps.get_column("response_token_ids"), ngram).alias(
            "repeated_ngram_ratio"
        ),
        (
            (pl.col("response_text").fill_null("").str.strip_chars() == "")
            & (tool_call_count() == 0)
        ).alias("reply_blank"),
        malformed_tool_calls().cast(pl.Int32).alias("malformed_tool_calls"),
    )


def _with_signals(
    rows: pl.DataFrame, turns: pl.LazyFrame | pl.DataFrame | None, ngram: int
) -> pl.DataFrame:
    """``rows`` with ``SIGNAL_COLUMNS`` for ``ngram``: as the step extractor stored them, else
    (steps from before it stored them, or another n) from the replies read from ``turns`` for
    those rows only."""
    declared = polars_schema(SCORED_STEPS)
    rows = rows.with_columns(
        pl.lit(None, declared[name]).alias(name) for name in SIGNAL_COLUMNS if name not in rows
    ).with_row_index("_order")
    stale = (
        pl.col("repetition_ngram").is_null()
        | (pl.col("repetition_ngram") != ngram)
        | pl.col("reply_blank").is_null()
    )
    missing = rows.filter(stale)
    if missing.is_empty():
        return rows.drop("_order")
    computed = token_signals(with_turn_columns(missing, turns, RESPONSE_COLUMNS), ngram)
    kept = rows.filter(~stale)
    return pl.concat([kept, computed.select(kept.columns)]).sort("_order").drop("_order")


def _signals(
    config: QualityConfig, latest_policy_version: pl.Expr, length_stats: pl.Expr
) -> dict[str, pl.Expr]:
    response_len = pl.col("response_len").fill_null(0)
    logprobs_len = pl.col("logprobs_len")
    mean, std = length_stats.struct.field("mean"), length_stats.struct.field("std")
    return {
        "not_engine_tokens": pl.col("token_source") != "engine",
        "logprobs_missing": logprobs_len.is_null() & (response_len > 0),
        "logprobs_misaligned": logprobs_len.is_not_null() & (logprobs_len != response_len),
        "truncated": pl.col("finish_reason") == "length",
        "empty_response": (response_len == 0) & pl.col("reply_blank"),
        "repetitive": pl.col("repeated_ngram_ratio") > config.repetition_threshold,
        "malformed_tool_call": pl.col("malformed_tool_calls") > 0,
        "error": pl.col("status") == "error",
        "prefix_break": ~pl.col("prefix_consistent"),
        "stale": (latest_policy_version - pl.col("policy_version")) > config.max_policy_lag,
        "length_outlier": ((response_len - mean).abs() / std) > config.length_z,
        "aborted": pl.col("close_reason") == "aborted",
    }


def score_steps(
    rewarded: pl.LazyFrame | pl.DataFrame,
    turns: pl.LazyFrame | pl.DataFrame | None,
    config: QualityConfig,
    *,
    latest_policy_version: int | None = None,
    response_length_stats: tuple[float, float] | None = None,
) -> pl.LazyFrame:
    """``derived_schemas.SCORED_STEPS`` rows: adds ``quality_score`` and ``quality_reasons``.

    Staleness is measured against ``latest_policy_version`` (default: the max in ``rewarded``).
    Length outliers use ``response_length_stats`` (mean, std over a reference population, e.g.
    the scored_steps table) when given, else the frame itself once it holds
    ``length_min_population`` steps; incremental runs should pass the table's statistics.
    Token and reply signals use the ``SIGNAL_COLUMNS`` the step extractor stored; rows without
    them for the configured n-gram read their replies from ``turns`` (a table scan, or any
    frame with the turns' ``RESPONSE_COLUMNS``).
    """
    frame = _with_signals(rewarded.lazy().collect(), turns, config.repetition_ngram).lazy()
    latest = (
        pl.col("policy_version").max()
        if latest_policy_version is None
        else pl.lit(latest_policy_version, pl.Int64)
    )
    if response_length_stats is None:
        lengths = pl.col("response_len").cast(pl.Float64)
        enough = pl.len() >= config.length_min_population
        stats = pl.struct(
            pl.when(enough).then(lengths.mean()).alias("mean"),
            pl.when(enough).then(lengths.std()).alias("std"),
        )
    else:
        mean, std = response_length_stats
        stats = pl.struct(
            pl.lit(mean, pl.Float64).alias("mean"), pl.lit(std, pl.Float64).alias("std")
        )
    weights = config.weights.model_dump()
    signals = {
        name: expr.fill_null(False)
        for name, expr in _signals(config, latest, stats).items()
        if weights[name] > 0
    }
    if not signals:
        scored = frame.with_columns(
            pl.lit(1.0).alias("quality_score"),
            pl.lit([], pl.List(pl.String)).alias("quality_reasons"),
        )
    else:
        scored = _scored(frame, signals, weights)
    return fit(scored, SCORED_STEPS)


def _scored(
    frame: pl.LazyFrame, signals: dict[str, pl.Expr], weights: dict[str, float]
) -> pl.LazyFrame:
    """``frame`` plus ``quality_score`` and ``quality_reasons`` from the ``signals`` it trips.
    Both are computed once per distinct combination of tripped signals (a bit each) and joined
    back: built on every row, the list of reasons took ~0.2 s per 100k steps."""
    bits = {name: 1 << i for i, name in enumerate(signals)}
    tripped = {name: (pl.col("_tripped") & bit) != 0 for name, bit in bits.items()}
    penalty = pl.sum_horizontal(
        [flag.cast(pl.Float64) * weights[name] for name, flag in tripped.items()]
    )
    reasons = pl.concat_list(
        [pl.when(flag).then(pl.lit(name)).otherwise(None) for name, flag in tripped.items()]
    ).list.drop_nulls()
    combination = pl.sum_horizontal(
        expr.cast(pl.Int64) * bits[name] for name, expr in signals.items()
    )
    keyed = frame.with_columns(combination.alias("_tripped"))
    scores = keyed.select(pl.col("_tripped").unique()).with_columns(
        (1.0 - penalty).clip(0.0, 1.0).alias("quality_score"), reasons.alias("quality_reasons")
    )
    return keyed.join(scores, on="_tripped", how="left", maintain_order="left").drop("_tripped")
