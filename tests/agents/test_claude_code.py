"""Claude Code (``claude -p``) from the npm registry against the real engine + capture proxy.

Its only changes are the ones docs/agents.md gives a user: the base URL, the key and the model
names (``policy``), identity as ``ANTHROPIC_CUSTOM_HEADERS``, and the switches that keep it off
the internet. Two prompts of one session (``--continue``): each call must land engine-exact, and
the second call's prompt must extend the first call's prompt and answer token for token.
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
    InstalledCli,
    NpmCli,
    assert_conversation_extends,
    assert_landed_engine_exact,
    model_calls,
    run_offline,
)
from stack_fixtures import CaptureStack

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


def test_claude_code_calls_land_engine_exact(
    capture_stack: CaptureStack, npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    claude = npm_cli(CLAUDE_CODE)
    trajectory, group = f"cc-{uuid.uuid4().hex[:8]}", "g-claude-code"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    with Relay(capture_stack.proxy_url) as relay, OutboundGuard() as guard:
        env = claude_env(relay.url, capture_stack.key, trajectory, group)
        answers = []
        for prompt, more in (("What is 17 + 25?", []), ("What is 6 * 7?", ["--continue"])):
            arguments = ["-p", prompt, *more, "--output-format", "json"]
            answers.append(
                json.loads(run_offline(claude, arguments, home, work, guard, env).stdout)
            )
    assert guard.attempts == []
    calls = model_calls(relay, "/v1/messages")
    rows = assert_landed_engine_exact(capture_stack, calls, trajectory, "messages")
    assert rows.height == len(calls) == 2  # one call per prompt: no side calls offline
    assert set(rows["group_id"]) == {group} and set(rows["agent"]) == {"claude-code"}
    assert [answer["is_error"] for answer in answers] == [False, False]
    assert len({answer["session_id"] for answer in answers}) == 1
    assert [answer["result"] for answer in answers] == rows["response_text"].to_list()
    assert_conversation_extends(rows)
