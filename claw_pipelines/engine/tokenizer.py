"""A fixed, invertible tokenizer for the simulated engine.

Token IDs are the point of the whole pipeline, so the simulator needs a tokenizer with the
properties real ones have where it matters: ``decode(encode(text)) == text`` for any text (bytes
fallback), atomic special tokens, and *canonical* output (``encode(decode(ids)) == ids`` for every
sequence the engine emits, including sequences cut at ``max_tokens``). Text is pre-split at
newlines, spaces before words, single digits and punctuation runs (like GPT/Qwen pre-tokenizers), so
concatenating chat-template segments never merges tokens across a segment boundary; that is what
makes multi-turn prompts extend earlier prompts token for token.

IDs: 0-255 are raw bytes, then word pieces, then the atomic tokens. The table is part of the data
contract (token IDs land in Delta), so only ever append to it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOLS_START = "<tools>"
TOOLS_END = "</tools>"
ATOMIC_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOLS_START,
    TOOLS_END,
)
"""Never split and never merged from text; the chat template and tool calls are built on them."""

_WORDS = [
    "the",
    "answer",
    "is",
    "what",
    "let",
    "me",
    "compute",
    "think",
    "about",
    "this",
    "step",
    "first",
    "then",
    "add",
    "multiply",
    "subtract",
    "plus",
    "minus",
    "times",
    "result",
    "so",
    "calculator",
    "tool",
    "call",
    "use",
    "check",
    "sure",
    "yes",
    "no",
    "number",
    "numbers",
    "and",
    "of",
    "to",
    "in",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "be",
    "was",
    "are",
    "by",
    "at",
    "from",
    "or",
    "an",
    "which",
    "we",
    "you",
    "your",
    "can",
    "will",
    "would",
    "should",
    "could",
    "question",
    "carefully",
    "careful",
    "consider",
    "tens",
    "ones",
    "digit",
    "digits",
    "carry",
    "sum",
    "product",
    "difference",
    "equals",
    "equal",
    "value",
    "final",
    "hmm",
    "well",
    "okay",
    "now",
    "again",
    "wait",
    "actually",
    "maybe",
    "perhaps",
    "not",
    "quite",
    "right",
    "correct",
    "wrong",
    "says",
    "returned",
    "gives",
    "got",
    "help",
    "helpful",
    "assistant",
    "user",
    "system",
    "function",
    "functions",
    "name",
    "arguments",
    "expression",
    "description",
    "parameters",
    "type",
    "object",
    "properties",
    "required",
    "string",
    "integer",
    "math",
    "arithmetic",
    "evaluate",
    "may",
    "one",
    "more",
    "return",
    "json",
    "within",
    "tags",
    "signature",
    "following",
    "provided",
    "here",
    "double",
]

_PUNCTUATION = (
    '{"',
    '":',
    ' "',
    '",',
    '"}',
    '"}}',
    ' {"',
    '."',
    '?"',
    " +",
    " -",
    " *",
    " /",
    " =",
    " (",
    "))",
    "**",
    "...",
    " ...",
)
_SPACES = ("  ", "    ", "        ")


def _pieces() -> tuple[str, ...]:
    variants = [
        form
        for word in _WORDS
        for form in (word, " " + word, word.capitalize(), " " + word.capitalize())
    ]
    digits = [f" {d}" for d in range(10)]
    pieces = [*variants, *digits, *_PUNCTUATION, *_SPACES]
    return tuple(p for p in dict.fromkeys(pieces) if len(p.encode()) > 1)


PIECES = _pieces()
_TOKEN_BYTES: tuple[bytes, ...] = (
    *(bytes([b]) for b in range(256)),
    *(p.encode() for p in PIECES),
    *(t.encode() for t in ATOMIC_TOKENS),
)
VOCAB_SIZE = len(_TOKEN_BYTES)
_PIECE_IDS = {p: 256 + i for i, p in enumerate(PIECES)}
_ATOMIC_IDS = {t: 256 + len(PIECES) + i for i, t in enumerate(ATOMIC_TOKENS)}
_MAX_PIECE = max(len(p) for p in PIECES)

ENDOFTEXT_ID = _ATOMIC_IDS[ENDOFTEXT]
IM_END_ID = _ATOMIC_IDS[IM_END]

_ATOMIC_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in ATOMIC_TOKENS) + ")")
_PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\n|[^\S\n]+")


@lru_cache(maxsize=65536)
def _encode_pretoken(text: str) -> tuple[int, ...]:
    """Greedy longest match over the pieces, raw UTF-8 bytes where no piece fits."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        for length in range(min(_MAX_PIECE, len(text) - i), 1, -1):
            piece_id = _PIECE_IDS.get(text[i : i + length])
            if piece_id is not None:
                ids.append(piece_id)
                i += length
                break
        else:
            ids.extend(text[i].encode())
            i += 1
    return tuple(ids)


def encode(text: str) -> list[int]:
    """Token IDs of ``text``; atomic tokens written literally in the text become their IDs."""
    ids: list[int] = []
    for part in _ATOMIC_SPLIT.split(text):
        atomic = _ATOMIC_IDS.get(part)
        if atomic is not None:
            ids.append(atomic)
        else:
            ids.extend(chain.from_iterable(map(_encode_pretoken, _PRETOKEN.findall(part))))
    return ids


@lru_cache(maxsize=512)
def _encode_turn(turn: str) -> tuple[int, ...]:
    return tuple(encode(turn))


def encode_turns(turns: Sequence[str]) -> list[int]:
    """``encode("".join(turns))`` for turns that each end at a newline, where the tokenizer always
    splits. Agents resend the whole conversation on every call, so turns are cached: a call only
    tokenizes the turns that are new since the last one."""
    return list(chain.from_iterable(map(_encode_turn, turns)))


def token_bytes(token_id: int) -> bytes:
    """The bytes one token stands for (atomic tokens stand for their literal text)."""
    if not 0 <= token_id < VOCAB_SIZE:
        raise ValueError(f"token id {token_id} is outside the vocabulary (size {VOCAB_SIZE})")
    return _TOKEN_BYTES[token_id]


def token_str(token_id: int) -> str:
    """One token as text, as vLLM shows it in logprobs (partial UTF-8 becomes U+FFFD)."""
    return token_bytes(token_id).decode("utf-8", errors="replace")


def decode(ids: list[int]) -> str:
    """The text of ``ids``; the inverse of ``encode``."""
    return b"".join(token_bytes(i) for i in ids).decode("utf-8", errors="replace")


MAX_CHARS_PER_TOKEN = max(len(token_str(i)) for i in range(VOCAB_SIZE))
"""The most characters one token stands for (vLLM bounds untokenized prompt text with it)."""
