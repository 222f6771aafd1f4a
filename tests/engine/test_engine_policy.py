"""The simulated policy: varied within a group, reproducible from the seed."""

from __future__ import annotations

import random
from collections import Counter

from fastapi.testclient import TestClient

from claw_pipelines.demo import CALCULATOR_TOOL
from claw_pipelines.engine.policy import respond_chat
from claw_pipelines.engine.protocol import Message, Tool
from claw_pipelines.engine.server import create_app
from claw_pipelines.engine.tasks import parse_final_answer

QUESTION = [{"role": "user", "content": "What is 37 + 45?"}]
TOOLS = [Tool.model_validate(CALCULATOR_TOOL)]


def outcome(choice: dict) -> str:
    if choice["finish_reason"] != "stop":
        return choice["finish_reason"]
    answer = parse_final_answer(choice["message"]["content"])
    return "correct" if answer == 82 else "wrong"


def test_rollouts_of_one_prompt_differ() -> None:
    with TestClient(create_app(seed=0)) as client:
        body = {"messages": QUESTION, "tools": [CALCULATOR_TOOL], "max_tokens": 64}
        outcomes = Counter(
            outcome(client.post("/v1/chat/completions", json=body).json()["choices"][0])
            for _ in range(150)
        )
    assert set(outcomes) == {"tool_calls", "correct", "wrong", "length"}


def _token_runs(seed: int) -> list[list[int]]:
    with TestClient(create_app(seed=seed)) as client:
        body = {"messages": QUESTION, "return_token_ids": True, "logprobs": True, "n": 2}
        return [
            c["token_ids"]
            for _ in range(8)
            for c in client.post("/v1/chat/completions", json=body).json()["choices"]
        ]


def test_engine_seed_reproduces_a_run() -> None:
    run = _token_runs(5)
    assert run == _token_runs(5)
    assert run != _token_runs(6)


def test_request_seed_pins_the_answer(client: TestClient) -> None:
    body = {"messages": QUESTION, "return_token_ids": True, "seed": 1234, "max_tokens": 50}
    first, second = (client.post("/v1/chat/completions", json=body).json() for _ in range(2))
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]


def test_answers_from_the_tool_result() -> None:
    messages = [
        Message(role="user", content="What is 37 + 45?"),
        Message(role="tool", content="82", tool_call_id="call-1"),
    ]
    for seed in range(20):
        draft = respond_chat(messages, TOOLS, None, 100, random.Random(seed))
        assert draft.tool_call is None
        assert parse_final_answer(draft.text) == 82


def test_sometimes_double_checks_once_with_the_tool() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "37 + 45"}'},
    }
    after_one_call = [
        Message(role="user", content="What is 37 + 45?"),
        Message.model_validate({"role": "assistant", "content": None, "tool_calls": [call]}),
        Message(role="tool", content="82", tool_call_id="c1"),
    ]
    drafts = [respond_chat(after_one_call, TOOLS, None, 100, random.Random(s)) for s in range(40)]
    rechecks = [d.tool_call.arguments for d in drafts if d.tool_call]
    assert rechecks
    assert set(rechecks) == {'{"expression": "45 + 37"}'}
    after_two_calls = [*after_one_call[:2], after_one_call[1], after_one_call[2]]
    for seed in range(40):
        assert (
            respond_chat(after_two_calls, TOOLS, None, 100, random.Random(seed)).tool_call is None
        )


def test_tool_choice_none_never_calls_and_no_task_gets_a_plain_reply() -> None:
    question = [Message(role="user", content="What is 3 * 4?")]
    for seed in range(50):
        assert respond_chat(question, TOOLS, "none", 100, random.Random(seed)).tool_call is None
    chat = respond_chat([Message(role="user", content="hello")], TOOLS, None, 100, random.Random(0))
    assert chat.tool_call is None
    assert parse_final_answer(chat.text) is None
