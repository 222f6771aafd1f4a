"""OpenClaw (``openclaw agent --local``) from the npm registry against the real engine + proxy.

OpenClaw is the agent the Claw-R1 paper is built around. Configured as docs/agents.md tells a
user: one custom provider whose ``baseUrl`` is the proxy, identity as provider ``headers``, model
``policy``; it needs Node >= 24.16, installed from npm as well. Two messages of one session
(``--session-id``) on the Responses API (``api: openai-responses``), the first answered after
running OpenClaw's own tools (its shell: ``pwd``, ``ls -p``, then a read per file), a kill -9 of
the proxy between them: every call must land engine-exact. Every request ends with OpenClaw's
internal-context message, which stays put while a message's tool calls are appended and moves
after the next message: the session is one trajectory whose only break is a ``context_edit`` at
the second message, and two sequences split exactly there, equal to the engine's answer log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from agent_relay import OutboundGuard, Relay
from agent_runs import (
    AGENT_TEST_TIMEOUT_S,
    LOOK,
    InstalledCli,
    NpmCli,
    assert_explored,
    assert_landed_engine_exact,
    assert_sequences_match_answer_log,
    kill_9_and_restart,
    model_calls,
    run_offline,
    session_stack,
    session_steps,
    tool_calls,
    work_folder,
)

pytestmark = pytest.mark.timeout(AGENT_TEST_TIMEOUT_S)

OPENCLAW = NpmCli("openclaw", "2026.9.6", "openclaw", node="24.22.3")
CONTEXT_START = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
MODEL = {
    "id": "policy",
    "name": "policy",
    "reasoning": False,
    "input": ["text"],
    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
    "contextWindow": 131072,
    "maxTokens": 4096,
}
API = "openai-responses"
"""OpenClaw's provider ``api``. Only this one runs here: each OpenClaw message costs about a
minute of CPU (its start-up: SQLite state, tool catalog, a 47 KB system prompt), and its chat
mode (``openai-completions``) differs only in the route (docs/agents.md says how it was
checked)."""


def openclaw_config(base_url: str, key: str, api: str, identity: dict[str, str], work: Path):
    provider = {"baseUrl": base_url, "apiKey": key, "api": api, "headers": identity}
    return {
        "models": {"mode": "merge", "providers": {"claw": provider | {"models": [MODEL]}}},
        "agents": {"defaults": {"model": {"primary": "claw/policy"}, "workspace": str(work)}},
    }


def _text(message: dict) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def assert_one_trajectory_edited_at_the_second_message(
    rows: pl.DataFrame, trajectory: str, first_message_calls: int
) -> None:
    """Each request's last user message is the context message, once; the first message's tool
    calls and results are appended after it, and the second message's first call moves it
    after the new message: a ``context_edit`` in the middle of the prompt."""
    for messages in rows["request_messages"]:
        texts = [_text(m) for m in json.loads(messages) if m["role"] == "user"]
        assert [t.startswith(CONTEXT_START) for t in texts].count(True) == 1
        assert texts[-1].startswith(CONTEXT_START)
    steps = session_steps(rows)
    assert steps["turn_id"].to_list() == rows["turn_id"].to_list()
    assert set(steps["trajectory_id"]) == {trajectory}
    reasons = steps["prefix_break_reason"].to_list()
    second = rows.height - first_message_calls
    assert reasons == [None] * first_message_calls + ["context_edit"] + [None] * (second - 1)


def test_openclaw_session_with_tool_calls_lands_engine_exact_through_a_kill_9(
    npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    openclaw = npm_cli(OPENCLAW)
    trajectory, group = f"oc-{uuid.uuid4().hex[:8]}", "g-openclaw"
    identity = {"x-claw-trajectory": trajectory, "x-claw-group": group, "x-claw-agent": "openclaw"}
    home = tmp_path / "home"
    (home / ".openclaw").mkdir(parents=True)
    work = work_folder(tmp_path / "work")
    answers, first_message_calls = [], 0
    with (
        session_stack(tmp_path / "stack") as stack,
        Relay(stack.proxy_url) as relay,
        OutboundGuard() as guard,
    ):
        config = openclaw_config(f"{relay.url}/v1", stack.key, API, identity, work)
        (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config))
        env = {"NODE_USE_ENV_PROXY": "1"}  # Node's fetch then goes through the guard too
        for prompt in (LOOK, "What is 6 * 7?"):
            if answers:
                first_message_calls = len(relay.exchanges)
                kill_9_and_restart(stack)
            arguments = ["agent", "--local", "--session-id", trajectory, "--message", prompt]
            done = run_offline(openclaw, [*arguments, "--json"], home, work, guard, env)
            answers.append(json.loads(done.stdout)["payloads"][-1]["text"])
        assert guard.attempts == []
        calls = model_calls(relay, "/v1/responses")
        rows = assert_landed_engine_exact(stack, calls, trajectory, "responses")
        assert rows.height == len(calls)  # no side calls
        assert set(rows["group_id"]) == {group} and set(rows["agent"]) == {"openclaw"}
        assert_explored(answers[0], work)
        assert tool_calls(rows) >= 3  # pwd, ls -p, at least one read: run by OpenClaw's tools
        final = rows.filter(pl.col("finish_reason") != "tool_calls")["response_text"]
        assert answers == [text.strip() for text in final]  # it trims replies
        assert_one_trajectory_edited_at_the_second_message(rows, trajectory, first_message_calls)
        assert assert_sequences_match_answer_log(stack, rows).height == 2
