import random

import pytest

from claw_pipelines.engine.chat_template import dumps, tool_call_text
from claw_pipelines.engine.policy import Draft, respond_text
from claw_pipelines.engine.protocol import FunctionCall
from claw_pipelines.engine.sampling import realize
from claw_pipelines.engine.tasks import generate_tasks
from claw_pipelines.engine.tokenizer import (
    ATOMIC_TOKENS,
    IM_END,
    IM_END_ID,
    VOCAB_SIZE,
    decode,
    encode,
    token_str,
)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "What is 37 + 45?",
        "héllo wörld 🎉 — ünïcode",
        "a\n\n  b\t\tc   \r\n",
        "<|im_start|>user\nhi<|im_end|>\n<tool_call>{}</tool_call>",
        "  leading and trailing  ",
        '{"name": "calculator", "arguments": {"expression": "(1 + 2) * 3"}}',
    ],
)
def test_decode_inverts_encode(text: str) -> None:
    ids = encode(text)
    assert decode(ids) == text
    assert all(0 <= i < VOCAB_SIZE < 2**31 for i in ids)


def test_atomic_tokens_are_single_ids() -> None:
    for token in ATOMIC_TOKENS:
        assert len(encode(token)) == 1
        assert token_str(encode(token)[0]) == token
    assert encode(f"x{IM_END}") == [*encode("x"), IM_END_ID]


def test_words_compress_and_digits_split() -> None:
    assert len(encode(" the answer is")) == 3
    assert [token_str(i) for i in encode(" 82")] == [" 8", "2"]


def test_engine_output_is_canonical_even_when_cut() -> None:
    """encode(decode(ids)) == ids for every prefix of what the engine can emit."""
    rng = random.Random(11)
    for task in generate_tasks(60, seed=5):
        call = FunctionCall(name="calculator", arguments=dumps({"expression": task.expression}))
        drafts = [respond_text(task.question, 40, rng), Draft("", tool_call=call)]
        for draft in drafts:
            sample = realize(draft, IM_END_ID, 10_000, 0, rng)
            ids = sample.token_ids
            assert ids[-1] == IM_END_ID
            for cut in range(len(ids) + 1):
                assert encode(decode(ids[:cut])) == ids[:cut]
        assert decode(encode(tool_call_text(call))) == tool_call_text(call)


def test_decode_rejects_unknown_ids() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode([VOCAB_SIZE])
