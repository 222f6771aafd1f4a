"""A turn stores what it adds to its trajectory's last call on its proxy worker, and every
prompt reads back exactly as the engine saw it: through two workers, a kill -9 mid-session, a
side call and an edited context."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import openai
import polars as pl
from stack_fixtures import CaptureStack, launch_stack

from claw_pipelines.processes import stop_group
from claw_pipelines.stack import start_proxy

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
        assert rows[turn_id]["request_messages"] == json.dumps(request, ensure_ascii=False)
        assert json.loads(rows[turn_id]["request_tools"] or "null") is None
    referring = raw.filter(pl.col("prompt_prefix_turn_id").is_not_null())
    assert referring.height >= 4, "consecutive calls on one worker share their prefix"
    writers = raw.select("turn_id", "writer_id")
    pairs = referring.join(writers, left_on="prompt_prefix_turn_id", right_on="turn_id")
    assert pairs.height == referring.height
    assert (pairs["writer_id"] == pairs["writer_id_right"]).all(), "a worker's own turns only"
    stored_tokens = raw["prompt_token_ids"].list.len().sum()
    assert stored_tokens < 0.6 * stored["prompt_token_ids"].list.len().sum()
