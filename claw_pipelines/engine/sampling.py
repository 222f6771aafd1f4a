"""Turn a policy draft into what an engine returns: token IDs, per-token logprobs, finish reason.

Like vLLM, a finished answer's ``token_ids`` end with the end-of-turn token (its logprob included),
a tool call finishes with ``tool_calls``, and an answer cut at ``max_tokens`` finishes with
``length``, its text being exactly the decoded kept tokens (and no tool call parsed).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from claw_pipelines.engine.chat_template import tool_call_text
from claw_pipelines.engine.policy import Draft
from claw_pipelines.engine.protocol import FunctionCall
from claw_pipelines.engine.tokenizer import VOCAB_SIZE, decode, encode

MIN_LOGPROB_GAP = 1e-6


def choice_rng(engine_seed: int, request_key: str, index: int) -> random.Random:
    """The RNG of one choice; ``request_key`` is the request's seed or the engine's request counter.

    String seeds hash with SHA-512 in CPython, so this is stable across processes and runs.
    """
    return random.Random(f"claw-sim:{engine_seed}:{request_key}:{index}")


@dataclass(frozen=True)
class Sample:
    """One generated choice."""

    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    tool_call: FunctionCall | None = None
    tool_call_id: str | None = None


def _logprob(rng: random.Random) -> float:
    """Mostly confident tokens with a long tail, always strictly below zero."""
    return -(rng.expovariate(4.0) + MIN_LOGPROB_GAP)


def _top(token_id: int, logprob: float, k: int, rng: random.Random) -> list[tuple[int, float]]:
    """The ``k`` likeliest tokens at one position: the sampled one plus alternatives."""
    if k == 0:
        return []
    rest = -math.expm1(logprob)
    shares = sorted(((1.0 - rng.random()) / k for _ in range(k - 1)), reverse=True)
    alternatives = [
        ((token_id + rng.randrange(1, VOCAB_SIZE)) % VOCAB_SIZE, math.log(rest * share))
        for share in shares
    ]
    return sorted([(token_id, logprob), *alternatives], key=lambda entry: -entry[1])


def realize(draft: Draft, end_id: int, max_tokens: int, top_k: int, rng: random.Random) -> Sample:
    """Tokenize ``draft``, append ``end_id``, cut at ``max_tokens``, draw logprobs from ``rng``."""
    text = draft.text if draft.tool_call is None else tool_call_text(draft.tool_call)
    ids = [*encode(text), end_id]
    finished = len(ids) <= max_tokens
    if finished:
        finish_reason = "stop" if draft.tool_call is None else "tool_calls"
    else:
        ids = ids[:max_tokens]
        text = decode(ids)
        finish_reason = "length"
    logprobs = [_logprob(rng) for _ in ids]
    top = [_top(token, logprob, top_k, rng) for token, logprob in zip(ids, logprobs, strict=True)]
    tool_call = draft.tool_call if finished else None
    tool_call_id = f"chatcmpl-tool-{rng.getrandbits(128):032x}" if tool_call else None
    return Sample(ids, text, finish_reason, logprobs, top, tool_call, tool_call_id)
