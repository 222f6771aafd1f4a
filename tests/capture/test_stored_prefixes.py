"""A turn stores what it adds to its trajectory's last call on its proxy worker, and every
prompt reads back exactly as the engine saw it: through two workers, a kill -9 mid-session, a
side call and an edited context, on chat completions, the Responses API and Messages."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import polars as pl
from stack_fixtures import CaptureStack, launch_stack

from claw_pipelines.processes import stop_group
from claw_pipelines.stack import start_proxy
from claw_pipelines.turn_prompts import with_whole_prompts

SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: check every sum twice." for i in range(40)
)
TRAJECTORY = "long-session"


def _client(stack: CaptureStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.proxy_url}/t/{TRAJECTORY}/g/v1",
        api_key=stack.key,
        max_retries=0,
        timeout=60,
        http_client=httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)),
    )  # a connection per call, so the calls spread over both workers


def _call(stack: CaptureStack, messages: list[dict], sent: dict[str, tuple[str, list]]) -> dict:
    raw = _client(stack).chat.completions.with_raw_response.create(
        model="policy", messages=messages, max_tokens=24
    )
    reply = raw.parse()
    sent[raw.headers["x-litellm-call-id"]] = (reply.id, [dict(m) for m in messages])
    return {"role": "assistant", "content": reply.choices[0].message.content or ""}


def _restart(stack: CaptureStack, workdir: Path) -> None:
    port = int(stack.proxy_url.rsplit(":", 1)[1])
    os.killpg(stack.proxy.pid, signal.SIGKILL)
    stack.proxy.process.wait(timeout=30)
    stack.proxy = start_proxy(port, workdir, f"{stack.engine.url}/v1", stack.env, num_workers=2)
    stack.proxy.wait_ready("/health/liveliness", timeout_s=240)


def test_every_rebuilt_prompt_is_the_engines_through_kill_9_side_calls_and_edits(
    tmp_path: Path,
) -> None:
    stack = launch_stack(tmp_path, num_workers=2)
    sent: dict[str, tuple[str, list]] = {}
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    try:
        for step in range(10):
            if step == 4:
                _restart(stack, tmp_path)  # mid-session: the workers' memory is gone
            if step == 6:  # a side call: a shorter prompt of the same trajectory
                _call(stack, [messages[0], {"role": "user", "content": "Summarize."}], sent)
            if step == 8:  # an edited context: the middle of the conversation dropped
                messages = [messages[0], *messages[-2:]]
            messages.append({"role": "user", "content": f"What is {step} + {step * 7}?"})
            messages.append(_call(stack, messages, sent))
            messages.append({"role": "user", "content": f"Tool output {step}: " + "ok " * 30})
        stored = stack.wait_for_rows(lambda df: set(sent) <= set(df["turn_id"]))
    finally:
        stop_group(stack.proxy.process, grace_s=30, sig=signal.SIGTERM)
        stack.engine.stop()
    raw = stack.lake.scan("turns").collect()
    answers = stack.engine_answers()
    rows = {row["turn_id"]: row for row in stored.iter_rows(named=True)}
    assert set(rows) == set(sent)
    for turn_id, (response_id, request) in sent.items():
        assert rows[turn_id]["prompt_token_ids"] == answers[response_id]["prompt_token_ids"]
        assert json.loads(rows[turn_id]["request_messages"]) == request
        assert json.loads(rows[turn_id]["request_tools"] or "null") is None
    referring = raw.filter(pl.col("prompt_prefix_turn_id").is_not_null())
    assert referring.height >= 4, "consecutive calls on one worker share their prefix"
    writers = raw.select("turn_id", "writer_id")
    pairs = referring.join(writers, left_on="prompt_prefix_turn_id", right_on="turn_id")
    assert pairs.height == referring.height
    assert (pairs["writer_id"] == pairs["writer_id_right"]).all(), "a worker's own turns only"
    stored_tokens = raw["prompt_token_ids"].list.len().sum()
    assert stored_tokens < 0.6 * stored["prompt_token_ids"].list.len().sum()


def _session(ask: Callable[[list[dict]], tuple[str, str, str]]) -> dict[str, tuple[str, list]]:
    """Six calls of one conversation, each resending it whole (the reply and a tool output
    added), a side call at the fourth and the middle of the conversation dropped at the fifth;
    ``ask`` sends the messages and returns (call id, the engine's response id, the reply)."""
    sent: dict[str, tuple[str, list]] = {}
    messages: list[dict] = []
    for step in range(6):
        if step == 3:  # a side call: a shorter prompt of the same trajectory
            side = [{"role": "user", "content": "Summarize."}]
            turn_id, response_id, _ = ask(side)
            sent[turn_id] = (response_id, side)
        if step == 4:  # an edited context
            messages = messages[-2:]
        messages.append({"role": "user", "content": f"What is {step} + {step * 7}?"})
        turn_id, response_id, reply = ask(messages)
        sent[turn_id] = (response_id, [dict(m) for m in messages])
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": f"Tool output {step}: " + "ok " * 30})
    return sent


def _assert_stored_as_references(
    stack: CaptureStack, trajectory: str, sent: dict[str, tuple[str, list]], field: str
) -> None:
    """Every turn after the first names an earlier one (one proxy worker saw them all), stores
    fewer prompt IDs than it has and its request as a difference, and rebuilds
    (``with_whole_prompts``, from the landed table) to the engine's prompt IDs and to the
    request as sent (``api_request``'s ``field``)."""
    stack.wait_for_rows(lambda df: set(sent) <= set(df["turn_id"]))
    landed = stack.lake.scan("turns")
    stored = landed.filter(pl.col("trajectory_id") == trajectory).collect().sort("started_at")
    assert stored["turn_id"].to_list() == list(sent)
    assert stored["prompt_prefix_turn_id"][0] is None
    assert stored["prompt_prefix_turn_id"][1:].is_not_null().all(), stored["prompt_prefix_turn_id"]
    later = stored.slice(1)
    assert (later["prompt_token_ids"].list.len() < later["prompt_len"]).all()
    assert later["api_request_shared"].is_not_null().all()  # the request text too
    answers = stack.engine_answers()
    for rebuilt in (with_whole_prompts(stored, landed), with_whole_prompts(later, landed)):
        for row in rebuilt.iter_rows(named=True):
            response_id, request = sent[row["turn_id"]]
            assert row["prompt_token_ids"] == answers[response_id]["prompt_token_ids"]
            assert json.loads(row["api_request"])[field] == request


def test_responses_calls_resent_whole_store_references_and_rebuild_exactly(
    capture_stack: CaptureStack,
) -> None:
    """Responses API calls (``input`` resent whole: the bridge answers ``previous_response_id``
    with a 400, as ``test_agent_apis`` checks)."""
    trajectory = f"responses-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(
        base_url=f"{capture_stack.proxy_url}/t/{trajectory}/g/v1",
        api_key=capture_stack.key,
        max_retries=0,
        timeout=60,
    )

    def ask(messages: list[dict]) -> tuple[str, str, str]:
        raw = client.responses.with_raw_response.create(
            model="policy", instructions=SYSTEM, input=messages, max_output_tokens=24
        )
        reply = raw.parse()
        return raw.headers["x-litellm-call-id"], reply.id, reply.output_text

    _assert_stored_as_references(capture_stack, trajectory, _session(ask), "input")


def test_messages_calls_store_references_and_rebuild_exactly(
    capture_stack: CaptureStack,
) -> None:
    trajectory = f"messages-{uuid.uuid4().hex[:8]}"
    client = anthropic.Anthropic(
        base_url=f"{capture_stack.proxy_url}/t/{trajectory}/g",
        api_key=capture_stack.key,
        max_retries=0,
        timeout=60,
    )

    def ask(messages: list[dict]) -> tuple[str, str, str]:
        raw = client.messages.with_raw_response.create(
            model="policy", system=SYSTEM, messages=messages, max_tokens=24
        )
        reply = raw.parse()
        text = "".join(block.text for block in reply.content if block.type == "text")
        return raw.headers["x-litellm-call-id"], reply.id, text

    _assert_stored_as_references(capture_stack, trajectory, _session(ask), "messages")
