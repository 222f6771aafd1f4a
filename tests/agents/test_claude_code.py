"""Claude Code (``claude -p``) from the npm registry against the real engine + capture proxy.

Its only changes are the ones docs/agents.md gives a user: the base URL, the key and the model
names (``policy``), identity as ``ANTHROPIC_CUSTOM_HEADERS``, and the switches that keep it off
the internet. A prompt answered after running Claude Code's ``Bash`` (``pwd``, ``ls -p``) and
``Read`` tools, the proxy killed with -9 and restarted while Claude Code waits for its third
call, the first two still in the spool: every call must land engine-exact, each prompt must
extend the previous prompt and answer token for token, and the session must become one sequence
equal to the engine's answer log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_relay import OutboundGuard, Relay
from agent_runs import (
    AGENT_TEST_TIMEOUT_S,
    LOOK,
    InstalledCli,
    NpmCli,
    assert_conversation_extends,
    assert_explored,
    assert_landed_engine_exact,
    assert_sequences_match_answer_log,
    kill_9_and_restart,
    model_calls,
    run_offline,
    session_stack,
    tool_calls,
    work_folder,
)

pytestmark = pytest.mark.timeout(AGENT_TEST_TIMEOUT_S)

CLAUDE_CODE = NpmCli("@anthropic-ai/claude-code", "2.1.197", "claude")
MODEL_SETTINGS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
)
OFFLINE = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


def claude_env(base_url: str, key: str, trajectory: str, group: str) -> dict[str, str]:
    identity = f"x-claw-trajectory: {trajectory}\nx-claw-group: {group}\nx-claw-agent: claude-code"
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_CUSTOM_HEADERS": identity,
        **dict.fromkeys(MODEL_SETTINGS, "policy"),
        **OFFLINE,
    }


def test_claude_code_session_with_tool_calls_lands_engine_exact_through_a_kill_9(
    npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    claude = npm_cli(CLAUDE_CODE)
    trajectory, group = f"cc-{uuid.uuid4().hex[:8]}", "g-claude-code"
    home = tmp_path / "home"
    home.mkdir()
    work = work_folder(tmp_path / "work")
    with (
        session_stack(tmp_path / "stack") as stack,
        Relay(
            stack.proxy_url, before_forward=lambda n: n == 2 and kill_9_and_restart(stack)
        ) as relay,
        OutboundGuard() as guard,
    ):
        env = claude_env(relay.url, stack.key, trajectory, group)
        arguments = ["-p", LOOK, "--output-format", "json"]
        answer = json.loads(run_offline(claude, arguments, home, work, guard, env).stdout)
        assert guard.attempts == []
        calls = model_calls(relay, "/v1/messages")
        rows = assert_landed_engine_exact(stack, calls, trajectory, "messages")
        assert rows.height == len(calls)  # no side calls offline
        assert set(rows["group_id"]) == {group} and set(rows["agent"]) == {"claude-code"}
        assert (answer["is_error"], answer["permission_denials"]) == (False, [])
        assert_explored(answer["result"], work)
        tools = [json.loads(m or "{}").get("tool_calls") or [] for m in rows["response_message"]]
        names = [call["function"]["name"] for calls_made in tools for call in calls_made]
        assert names.count("Bash") >= 2 and "Read" in names  # pwd, ls -p, then Read
        assert tool_calls(rows) == len(names) == rows.height - 1
        assert rows["response_text"][-1] == answer["result"]
        assert_conversation_extends(rows)
        assert assert_sequences_match_answer_log(stack, rows).height == 1


def test_claude_code_sub_agent_explores_in_a_side_trajectory(
    npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    """Asked for a sub-agent, the engine calls Claude Code's ``Agent`` tool; the sub-agent runs
    its own loop (Bash, Read) under its own system prompt and its report is the answer. Both
    conversations land engine-exact under the session's identity and become a sequence each:
    the session's two calls, and the sub-agent's as a side trajectory."""
    claude = npm_cli(CLAUDE_CODE)
    trajectory, group = f"cc-{uuid.uuid4().hex[:8]}", "g-claude-code"
    home = tmp_path / "home"
    home.mkdir()
    work = work_folder(tmp_path / "work")
    with (
        session_stack(tmp_path / "stack", hold=False) as stack,
        Relay(stack.proxy_url) as relay,
        OutboundGuard() as guard,
    ):
        env = claude_env(relay.url, stack.key, trajectory, group)
        prompt = "Use a sub-agent to look around the working directory."
        arguments = ["-p", prompt, "--output-format", "json"]
        answer = json.loads(run_offline(claude, arguments, home, work, guard, env).stdout)
        assert guard.attempts == []
        calls = model_calls(relay, "/v1/messages")
        rows = assert_landed_engine_exact(stack, calls, trajectory, "messages")
        assert rows.height == len(calls)
        assert answer["result"].startswith("A sub-agent explored the working directory.")
        assert_explored(answer["result"], work)
        sequences = assert_sequences_match_answer_log(stack, rows)
        by_trajectory = dict(zip(sequences["trajectory_id"], sequences["turn_ids"], strict=True))
        assert len(by_trajectory) == 2 and len(by_trajectory.pop(trajectory)) == 2
        side, turns = by_trajectory.popitem()
        assert side.startswith(trajectory) and len(turns) == rows.height - 2 >= 4
