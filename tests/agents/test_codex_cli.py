"""Codex CLI (``codex exec``) from the npm registry against the real engine + capture proxy.

Configured as docs/agents.md tells a user: a model provider whose ``base_url`` is the proxy
(identity as the ``/t/<trajectory>/<group>`` prefix, the agent name as an ``http_headers``
entry), ``model = "policy"``, and the switches that keep it off the internet. A task the engine
answers by running Codex's shell (``pwd``, ``ls -p``, ``cat`` of each file), then, after a kill -9
of the proxy, a follow-up in the same session (``exec resume --last``): every call must land
engine-exact, each prompt must extend the previous prompt and answer token for token, and the
session must become one sequence equal to the engine's answer log.
"""

from __future__ import annotations

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


def test_codex_cli_session_with_tool_calls_lands_engine_exact_through_a_kill_9(
    npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    codex = npm_cli(CODEX)
    trajectory, group = f"codex-{uuid.uuid4().hex[:8]}", "g-codex"
    home, codex_home = tmp_path / "home", tmp_path / "codex-home"
    for folder in (home, codex_home):
        folder.mkdir()
    work = work_folder(tmp_path / "work")
    answers = []
    with (
        session_stack(tmp_path / "stack") as stack,
        Relay(stack.proxy_url) as relay,
        OutboundGuard() as guard,
    ):
        base_url = f"{relay.url}/t/{trajectory}/{group}/v1"
        (codex_home / "config.toml").write_text(CONFIG.format(base_url=base_url))
        env = {"CODEX_HOME": str(codex_home), "CLAW_API_KEY": stack.key}
        for prompt, resume in ((LOOK, []), ("What is 6 * 7?", ["resume", "--last"])):
            if answers:
                kill_9_and_restart(stack)
            last = tmp_path / f"answer-{len(answers)}.txt"
            arguments = ["exec", "--skip-git-repo-check", "--sandbox", "read-only"]
            arguments += ["--output-last-message", str(last), *resume, prompt]
            run_offline(codex, arguments, home, work, guard, env)
            answers.append(last.read_text())
        assert guard.attempts == []
        calls = model_calls(relay, "/v1/responses")
        rows = assert_landed_engine_exact(stack, calls, trajectory, "responses")
        assert rows.height == len(calls)  # Codex makes no side calls
        assert set(rows["group_id"]) == {group} and set(rows["agent"]) == {"codex"}
        assert_explored(answers[0], work)
        assert tool_calls(rows) >= 3  # pwd, ls -p, at least one cat: run by Codex's shell
        final = rows.filter(pl.col("finish_reason") != "tool_calls")["response_text"].to_list()
        assert answers == final
        assert_conversation_extends(rows)
        sequences = assert_sequences_match_answer_log(stack, rows)
        assert sequences.height == 1
