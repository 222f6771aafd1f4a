"""The context window, checked as vLLM 0.33's OpenAI server checks it.

vLLM (``renderers/params.py`` ``TokenizeParams``, ``serve/utils/api_utils.py`` ``get_max_tokens``,
``SamplingParams``) does, in this order:

1. refuse a ``max_tokens`` (or ``max_completion_tokens``) larger than the whole window;
2. refuse prompt text longer than the window times the longest token's characters, untokenized;
3. refuse a prompt of more tokens than the window. Text is tokenized truncated to one token past
   the window, so an over-long text prompt is reported as "at least" window + 1 tokens;
4. **clamp** ``max_tokens`` to the room the prompt leaves (so Claude Code's ``max_tokens: 32000``
   on a long prompt is served, not refused), and refuse a result below one token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from claw_pipelines.engine.errors import validation_error
from claw_pipelines.engine.tokenizer import MAX_CHARS_PER_TOKEN, encode_turns

DEFAULT_MAX_MODEL_LEN = 262_144
"""Twice the 131,072 of a typical served model: this tokenizer spends about three times the tokens
of a real BPE tokenizer on the same text, and agent CLIs send prompts of 30k-55k real tokens."""


@dataclass(frozen=True)
class ContextWindow:
    max_model_len: int = DEFAULT_MAX_MODEL_LEN

    def check_output_request(self, requested: int | None, param: str) -> None:
        """Step 1; ``param`` names the field the number came from."""
        if requested is not None and requested > self.max_model_len:
            raise validation_error(
                f"{param}={requested} cannot be greater than max_model_len={self.max_model_len}. "
                "Please request fewer output tokens.",
                param,
                requested,
            )

    def encode_prompt(self, turns: Sequence[str]) -> list[int]:
        """Steps 2 and 3 for a text prompt, given as ``tokenizer.encode_turns`` takes it: its
        token IDs, if they fit."""
        chars = sum(map(len, turns))
        max_chars = self.max_model_len * MAX_CHARS_PER_TOKEN
        if chars > max_chars:
            raise validation_error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {chars} characters (more than {max_chars} characters, "
                f"which is the upper bound for {self.max_model_len} input tokens). Please reduce "
                "the length of the input prompt.",
                "input_text",
                chars,
            )
        ids = encode_turns(turns)
        self.check_prompt_ids(ids[: self.max_model_len + 1])
        return ids

    def check_prompt_ids(self, ids: list[int]) -> list[int]:
        """Step 3 for a prompt given as token IDs."""
        count = len(ids)
        if count > self.max_model_len:
            qualifier = "at least " if count == self.max_model_len + 1 else ""
            raise validation_error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {qualifier}{count} input tokens, which exceeds this limit "
                "even without any output tokens. Please reduce the length of the input prompt.",
                "input_tokens",
                count,
            )
        return ids

    def output_budget(self, prompt_tokens: int, requested: int | None) -> int:
        """Step 4: how many tokens may be generated."""
        room = self.max_model_len - prompt_tokens
        budget = room if requested is None else min(room, requested)
        if budget < 1:
            raise validation_error(
                f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget
            )
        return budget
