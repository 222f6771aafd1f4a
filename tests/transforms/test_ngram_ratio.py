"""The repeated n-gram ratio equals a plain-Python count on random, repetitive and degenerate
sequences, on both of its key paths (ids packed exactly, or mixed when n of them need more
than 63 bits)."""

from __future__ import annotations

import random

import polars as pl
import pytest

from claw_pipelines.transforms.quality import repeated_ngram_ratio


def _reference(sequences: list[list[int | None] | None], n: int) -> list[float]:
    ratios = []
    for ids in sequences:
        grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)] if ids else []
        ratios.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return ratios


def _sequence(rng: random.Random, vocabulary: int) -> list[int | None] | None:
    length = rng.choice([0, 1, 2, 3, 4, 5, rng.randint(0, 300)])
    kind = rng.random()
    if kind < 0.05:
        return None
    if kind < 0.15:  # null ids among few values
        return [rng.choice([None, 1, 2]) for _ in range(length)]
    if kind < 0.45:  # a pattern repeated, as a looping generation
        pattern = [rng.randint(-vocabulary, vocabulary) for _ in range(rng.randint(1, 6))]
        return (pattern * (length // len(pattern) + 1))[:length]
    return [rng.randint(0, vocabulary) for _ in range(length)]


@pytest.mark.parametrize("seed", range(40))
def test_repeated_ngram_ratio_equals_a_plain_count(seed: int) -> None:
    rng = random.Random(seed)
    vocabulary = [2, 50, 1_000, 32_000, 150_000, 2**31 - 1][seed % 6]
    sequences = [_sequence(rng, vocabulary) for _ in range(rng.randint(0, 40))]
    tokens = pl.Series("response_token_ids", sequences, dtype=pl.List(pl.Int32))
    chunked = pl.concat([tokens.head(5), tokens.slice(5)], rechunk=False)
    for n in (1, 2, 3, 4, 5, 8):
        ratios = repeated_ngram_ratio(chunked, n)
        assert ratios.name == "response_token_ids" and ratios.dtype == pl.Float64
        assert ratios.to_list() == _reference(sequences, n)


def test_degenerate_sequences() -> None:
    cases = [
        ([], pl.Int32),
        ([None, [], None], pl.Int32),  # no ids
        ([[1, 2, 3], [7]], pl.Int32),  # shorter than n
        ([[5] * 300, [5] * 4], pl.Int32),  # all equal
        ([[None] * 6, [None, 1, None, 1, None]], pl.Int32),  # null ids
        ([[-(2**31), 2**31 - 1] * 3], pl.Int32),
        ([[-(2**63), 2**63 - 1, -(2**63)] * 3, [None, 0, None, 0]], pl.Int64),
        ([[2**64 - 1, 1, 2**64 - 1, 1, 2**63]], pl.UInt64),  # (a, b) and (b, a) near 2^63
    ]
    for sequences, dtype in cases:
        tokens = pl.Series("t", sequences, dtype=pl.List(dtype))
        for n in (1, 2, 3, 4):
            assert repeated_ngram_ratio(tokens, n).to_list() == _reference(sequences, n)
