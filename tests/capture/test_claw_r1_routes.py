"""Claw-R1's gateway routes through the real proxy and engine: white-box steps, token-ID
generation, streamed chat, bad bodies, and who may call without the key."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import polars as pl
import pytest
from claw_r1_agent import CALCULATOR
from stack_fixtures import CaptureStack

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
CLAW_R1_CALLS = [
    ("/init_trajectory", None),
    ("/t1/p1/v1/register_trajectory", {"channel": "train", "metadata": {"ground_truth": "4"}}),
    ("/t1/p1/v1/chat/completions", {"model": "default", "messages": QUESTION}),
    ("/t1/p1/v1/complete_trajectory", {"reward": 1.0, "channel": "train"}),
    ("/submit_steps", {"steps": [{"prompt_ids": [1, 2], "response_ids": [3]}]}),
    ("/generate", {"prompt_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}),
]  # fmt: skip
MATH_STEP_METADATA = {"data_source": "math", "reward_model": {"ground_truth": "7"}}


def _rows(stack: CaptureStack, table: str, column: str, keys: set[str]) -> pl.DataFrame:
    rows = stack.wait_for_rows(lambda df: keys <= set(df[column]), table=table)
    return rows.filter(pl.col(column).is_in(list(keys)))


@pytest.mark.parametrize(("path", "body"), CLAW_R1_CALLS, ids=[p for p, _ in CLAW_R1_CALLS])
def test_without_the_switch_claw_r1_routes_are_not_served(
    capture_stack: CaptureStack, path: str, body: dict | None
) -> None:
    """The shared proxy runs without ``--compat``: no key is a 401, and with the key LiteLLM
    knows no such route."""
    url = capture_stack.proxy_url + path
    for key in (None, "not-needed"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 401
    key = {"Authorization": f"Bearer {capture_stack.key}"}
    keyed = httpx.post(url, json=body, headers=key, timeout=60)
    assert keyed.status_code == 404, keyed.text


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/t/a/b/v1/chat/completions", "/claw/v1/status"]
)
def test_our_own_routes_still_need_the_key(claw_r1_stack: CaptureStack, path: str) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    answer = httpx.post(claw_r1_stack.proxy_url + path, json=body, timeout=30)
    assert answer.status_code == 401
    if path != "/claw/v1/status":
        keyed = httpx.post(
            claw_r1_stack.proxy_url + path,
            json=body,
            headers={"Authorization": f"Bearer {claw_r1_stack.key}"},
            timeout=60,
        )
        assert keyed.status_code == 200, keyed.text


def test_the_alias_is_the_default_model_on_our_routes_too(claw_r1_stack: CaptureStack) -> None:
    """``default`` reaches ``policy`` (hidden from ``/v1/models``) and lands as a turn."""
    key = {"Authorization": f"Bearer {claw_r1_stack.key}"}
    trajectory = f"alias-{uuid.uuid4().hex[:8]}"
    answer = httpx.post(
        f"{claw_r1_stack.proxy_url}/t/{trajectory}/g/v1/chat/completions",
        json={"model": "default", "messages": QUESTION},
        headers=key,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    (row,) = _rows(claw_r1_stack, "turns", "trajectory_id", {trajectory}).rows(named=True)
    assert row["token_source"] == "engine" and row["response_token_ids"]
    models = httpx.get(f"{claw_r1_stack.proxy_url}/v1/models", headers=key, timeout=30).json()
    assert "default" not in {model["id"] for model in models["data"]}


def test_submitted_steps_land_as_white_box_steps_with_their_rewards(
    claw_r1_stack: CaptureStack,
) -> None:
    """A ``submit_steps`` body as Claw-R1's white-box agents send it, steps out of order."""
    trajectory, group = f"wb-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    steps = [
        {"prompt_ids": [5, 6, 7, 8, 9, 10], "response_ids": [11, 12], "reward": 1.0,
         "rollout_log_probs": [-0.25, -0.5], "trajectory_uid": trajectory, "prompt_uid": group,
         "step_index": 1, "policy_version": 3, "is_last": True, "metadata": MATH_STEP_METADATA},
        {"prompt_ids": [5, 6, 7], "response_ids": [8, 9], "reward": 0.0,
         "trajectory_uid": trajectory, "prompt_uid": group, "step_index": 0, "policy_version": 3,
         "is_last": False, "metadata": MATH_STEP_METADATA},
    ]  # fmt: skip
    answer = httpx.post(
        f"{claw_r1_stack.proxy_url}/submit_steps?channel=val", json={"steps": steps}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": 2}

    turns = _rows(claw_r1_stack, "turns", "trajectory_id", {trajectory}).sort("started_at")
    assert turns["response_token_ids"].to_list() == [[8, 9], [11, 12]]  # in step_index order
    assert turns["prompt_token_ids"].to_list() == [[5, 6, 7], [5, 6, 7, 8, 9, 10]]
    assert turns["response_logprobs"].to_list() == [None, [-0.25, -0.5]]
    assert set(turns["call_type"]) == {"step"} and set(turns["token_source"]) == {"engine"}
    assert set(turns["group_id"]) == {group} and set(turns["channel"]) == {"val"}
    assert set(turns["policy_version"]) == {3}
    claw = [json.loads(m)["claw"] for m in turns["metadata"]]
    assert claw == [
        {"ground_truth": "7", "data_source": "math", "step_index": i, "is_last": bool(i)}
        for i in (0, 1)
    ]
    by_turn = dict(zip(turns["turn_id"], turns["response_token_ids"].to_list(), strict=True))
    rewards = _rows(claw_r1_stack, "rewards", "turn_id", set(by_turn))
    assert {
        by_turn[t][0]: v for t, v in zip(rewards["turn_id"], rewards["value"], strict=True)
    } == {
        8: 0.0,
        11: 1.0,
    }
    assert set(rewards["source"]) == {"env"}
    (completion,) = _rows(claw_r1_stack, "trajectory_events", "trajectory_id", {trajectory}).rows(
        named=True
    )
    assert (completion["event"], completion["group_id"]) == ("completed", group)


@pytest.mark.parametrize(
    ("step", "says"),
    [
        ({"multi_modal_data": {"image": [1]}}, "multi_modal_data is not supported"),
        ({"routed_experts": [[0, 1]]}, "routed_experts is not supported"),
        ({"rollout_log_probs": [-0.1]}, "rollout_log_probs must have one value per response token"),
        ({"rollout_log_probs": [0.5, -0.1]}, "less than or equal to 0"),
        ({"step_idx": 1}, "Extra inputs are not permitted"),
        ({"policy_version": 1.5}, "valid integer"),
    ],
)
def test_a_step_we_cannot_keep_is_refused_by_name(
    claw_r1_stack: CaptureStack, step: dict, says: str
) -> None:
    body = {"steps": [{"prompt_ids": [1, 2], "response_ids": [3, 4], **step}]}
    answer = httpx.post(f"{claw_r1_stack.proxy_url}/submit_steps", json=body, timeout=30)
    assert answer.status_code == 400
    assert says in json.dumps(answer.json()["problems"])


def test_generate_takes_token_ids_and_returns_the_engines(claw_r1_stack: CaptureStack) -> None:
    """Token IDs in, the engine's token IDs out, and the call lands as a completion turn."""
    prompt = [2, 5, 17, 44, 91, 3]
    trajectory = f"gen-{uuid.uuid4().hex[:8]}"
    body = {
        "prompt_ids": prompt,
        "sampling_params": {"max_tokens": 12, "temperature": 0.7, "logprobs": True, "top_k": 20},
        "trajectory_uid": trajectory,
        "prompt_uid": "g-gen",
    }
    answer = httpx.post(f"{claw_r1_stack.proxy_url}/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    generated = answer.json()
    (row,) = _rows(claw_r1_stack, "turns", "trajectory_id", {trajectory}).rows(named=True)
    sent = next(
        a
        for a in claw_r1_stack.engine_answers().values()
        if a["token_ids"] == row["response_token_ids"]
    )
    assert row["prompt_token_ids"] == prompt == sent["prompt_token_ids"]
    assert generated["token_ids"] == sent["token_ids"] and len(sent["token_ids"]) <= 12
    assert generated["log_probs"] == pytest.approx(sent["logprobs"], rel=1e-6)
    assert generated["stop_reason"] == sent["finish_reason"]
    assert (row["call_type"], row["token_source"], row["group_id"]) == (
        "completion",
        "engine",
        "g-gen",
    )
    assert json.loads(row["sampling_params"])["temperature"] == 0.7
    without = httpx.post(
        f"{claw_r1_stack.proxy_url}/generate", json={"prompt_ids": prompt}, timeout=60
    )
    assert without.status_code == 200 and without.json()["log_probs"] is None


def test_a_streamed_chat_gets_the_tool_call_text_in_its_content(
    claw_r1_stack: CaptureStack,
) -> None:
    """Claw-R1's gateway ignores ``stream``; here a streaming agent gets a stream, in Claw-R1's
    answer shape, served from a non-streaming engine call (so the turn keeps its IDs). The
    registration's channel and policy version reach the turn."""
    trajectory = f"s-{uuid.uuid4().hex[:8]}"
    base = f"{claw_r1_stack.proxy_url}/{trajectory}/p-stream/v1"
    registration = {"channel": "val", "metadata": {"policy_version": 7}}
    httpx.post(f"{base}/register_trajectory", json=registration, timeout=30).raise_for_status()
    client = openai.OpenAI(base_url=base, api_key="not-needed", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is 17 + 25?"}],
        tools=[CALCULATOR],
        tool_choice="required",
        stream=True,
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "17 + 25"}}</tool_call>'
    )
    assert not any(chunk.choices[0].delta.tool_calls for chunk in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    (row,) = _rows(claw_r1_stack, "turns", "trajectory_id", {trajectory}).rows(named=True)
    assert (row["stream"], row["finish_reason"], row["token_source"]) == (
        True,
        "tool_calls",
        "engine",
    )
    assert (row["channel"], row["policy_version"]) == ("val", 7)
    (call,) = json.loads(row["response_message"])["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"expression": "17 + 25"}
