"""The usual phrasings of a task are understood; a prompt without one gets a reply that has none."""

from __future__ import annotations

import json
import random

import pytest
from fastapi.testclient import TestClient

from claw_pipelines.demo import CALCULATOR_TOOL
from claw_pipelines.engine.policy import NO_TASK_REPLY, respond_chat, respond_text
from claw_pipelines.engine.protocol import Message, Tool
from claw_pipelines.engine.tasks import Task, parse_question

TOOLS = [Tool.model_validate(CALCULATOR_TOOL)]


@pytest.mark.parametrize(
    ("text", "task"),
    [
        ("What is 17 + 25?", Task(17, "+", 25)),
        ("17 + 25", Task(17, "+", 25)),
        ("17 plus 25", Task(17, "+", 25)),
        ("what's 17 times 3", Task(17, "*", 3)),
        ("What\u2019s 17 times 3?", Task(17, "*", 3)),
        ("17 minus 4", Task(17, "-", 4)),
        ("compute 6*7", Task(6, "*", 7)),
        ("17+25=?", Task(17, "+", 25)),
        ("17 + 25 = ?", Task(17, "+", 25)),
        ("Calculate: 12 x 12.", Task(12, "*", 12)),
        ("how much is 9 \u00d7 8", Task(9, "*", 8)),
        ("What is 17 multiplied by 3?", Task(17, "*", 3)),
        ("What is -3 - -5?", Task(-3, "-", -5)),
        ("what is the result of 8 minus 10", Task(8, "-", 10)),
        ("What is the sum of 17 and 25?", Task(17, "+", 25)),
        ("Subtract 4 from 17.", Task(17, "-", 4)),
        ("Multiply 6 by 7", Task(6, "*", 7)),
        ("Hi there!\n17 + 25\n", Task(17, "+", 25)),
        ("Please answer. What is 3 + 4? And what is 5 * 6?", Task(5, "*", 6)),
    ],
)
def test_usual_phrasings_are_understood(text: str, task: Task) -> None:
    assert parse_question(text) == task


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "What is 2 + 3 * 4?",  # three operands: not one of its tasks
        "What is 2.5 + 3?",
        "What is 17 divided by 3?",
        "Today's date is 2025-01-15.",
        "what is 2025-01-15",
        "Upgrade from v2 + 3 patches",
        "We met 10 - 11 am, see line 3.",
        "17 - 4 = 13",
        NO_TASK_REPLY,
    ],
)
def test_text_without_a_task_is_not_read_as_one(text: str) -> None:
    assert parse_question(text) is None


def test_every_phrasing_reaches_the_calculator_as_the_same_expression(client: TestClient) -> None:
    for text in ("17 plus 25", "17+25=?", "compute 17 + 25", "the sum of 17 and 25"):
        body = {
            "messages": [{"role": "user", "content": text}],
            "tools": [CALCULATOR_TOOL],
            "tool_choice": "required",
        }
        (call,) = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"][
            "tool_calls"
        ]
        assert json.loads(call["function"]["arguments"]) == {"expression": "17 + 25"}


def test_a_conversation_quoting_the_canned_reply_gets_it_again(client: TestClient) -> None:
    messages = [{"role": "user", "content": "hello"}]
    for _ in range(3):
        body = {"messages": messages, "tools": [CALCULATOR_TOOL], "tool_choice": "required"}
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert choice["message"]["content"] == NO_TASK_REPLY
        messages += [
            choice["message"],
            {"role": "user", "content": f'You said: "{choice["message"]["content"]}" Why?'},
        ]


def test_a_prompt_continuing_the_canned_reply_gets_it_again(client: TestClient) -> None:
    prompt = "User: hello\nAssistant:"
    for seed in range(3):
        choice = client.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 64, "seed": seed}
        ).json()["choices"][0]
        assert choice["text"] == " " + NO_TASK_REPLY
        prompt += choice["text"] + "\nUser: and?\nAssistant:"


def test_the_canned_reply_is_short_plain_text() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        chat = respond_chat([Message(role="user", content="hi")], TOOLS, "required", 100, rng)
        assert (chat.text, chat.tool_call) == (NO_TASK_REPLY, None)
        assert respond_text("Once upon a time", 100, rng).text == " " + NO_TASK_REPLY
    assert len(NO_TASK_REPLY) < 120
    assert not any(ch.isdigit() for ch in NO_TASK_REPLY)
