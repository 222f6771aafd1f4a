"""Codex CLI (``codex exec``) from the npm registry against the real engine + capture proxy.

Configured as docs/agents.md tells a user: a model provider whose ``base_url`` is the proxy
(identity as the ``/t/<trajectory>/<group>`` prefix, the agent name as an ``http_headers``
entry), ``model = "policy"``, and the switches that keep it off the internet. A task and a
follow-up in the same session (``exec resume --last``): each call must land engine-exact, and
the follow-up's prompt must extend the first call's prompt and answer token for token.
"""

from __future__ import annotations

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

CODEX = NpmCli("@openai/codex", "0.171.0", "codex")
CONFIG = """\
model = "policy"
model_provider = "claw"
check_for_update_on_startup = false

[model_providers.claw]
name = "claw"
base_url = "{base_url}"
wire_api = "responses"
env_key = "CLAW_API_KEY"
http_headers = {{ "x-claw-agent" = "codex" }}

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
remote_plugin = false
apps = false
api_key_model_discovery = false
"""


def test_codex_cli_calls_land_engine_exact(
    capture_stack: CaptureStack, npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    codex = npm_cli(CODEX)
    trajectory, group = f"codex-{uuid.uuid4().hex[:8]}", "g-codex"
    home, codex_home, work = tmp_path / "home", tmp_path / "codex-home", tmp_path / "work"
    for folder in (home, codex_home, work):
        folder.mkdir()
    answers = []
    with Relay(capture_stack.proxy_url) as relay, OutboundGuard() as guard:
        base_url = f"{relay.url}/t/{trajectory}/{group}/v1"
        (codex_home / "config.toml").write_text(CONFIG.format(base_url=base_url))
        env = {"CODEX_HOME": str(codex_home), "CLAW_API_KEY": capture_stack.key}
        for prompt, resume in (("What is 17 + 25?", []), ("What is 6 * 7?", ["resume", "--last"])):
            last = tmp_path / f"answer-{len(answers)}.txt"
            arguments = ["exec", "--skip-git-repo-check", "--sandbox", "read-only"]
            arguments += ["--output-last-message", str(last), *resume, prompt]
            run_offline(codex, arguments, home, work, guard, env)
            answers.append(last.read_text())
    assert guard.attempts == []
    calls = model_calls(relay, "/v1/responses")
    rows = assert_landed_engine_exact(capture_stack, calls, trajectory, "responses")
    assert rows.height == len(calls) == 2  # Codex makes no side calls
    assert set(rows["group_id"]) == {group} and set(rows["agent"]) == {"codex"}
    assert answers == rows["response_text"].to_list()
    assert_conversation_extends(rows)
