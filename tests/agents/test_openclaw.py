"""OpenClaw (``openclaw agent --local``) from the npm registry against the real engine + proxy.

OpenClaw is the agent the Claw-R1 paper is built around. Configured as docs/agents.md tells a
user: one custom provider whose ``baseUrl`` is the proxy, identity as provider ``headers``, model
``policy``; it needs Node >= 24.16, installed from npm as well. Two messages of one session
(``--session-id``) on the Responses API (``api: openai-responses``): each call must land
engine-exact, and since every request ends with OpenClaw's internal-context message, which the
next call moves after the new messages, the two calls must make one trajectory whose second step
is a ``tail_edit`` keeping all of the first prompt but that message, with identity and without.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from agent_relay import OutboundGuard, Relay
from agent_runs import (
    AGENT_TEST_TIMEOUT_S,
    InstalledCli,
    NpmCli,
    assert_landed_engine_exact,
    model_calls,
    run_offline,
)
from stack_fixtures import CaptureStack

from claw_pipelines.transforms import extract_steps

pytestmark = pytest.mark.timeout(AGENT_TEST_TIMEOUT_S)

OPENCLAW = NpmCli("openclaw", "2026.9.6", "openclaw", node="24.22.3")
CONTEXT_START = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
IDLE_TIMEOUT_S = 600
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
    content = message["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def _steps(rows: pl.DataFrame) -> pl.DataFrame:
    """The steps extraction makes of ``rows`` once their trajectory has gone idle."""
    now = rows["ended_at"].max() + timedelta(seconds=IDLE_TIMEOUT_S + 1)
    extraction = extract_steps(rows, None, None, now=now, idle_timeout_s=IDLE_TIMEOUT_S)
    return extraction.steps.sort("step_index")


def assert_one_tail_edited_trajectory(rows: pl.DataFrame, trajectory: str) -> None:
    """Each request ends with the context message; the second call kept all of the first
    prompt before it, so extraction makes one trajectory, its second step a ``tail_edit``, both
    with the agent's identity and with none (trajectory inference)."""
    requests = [json.loads(messages) for messages in rows["request_messages"]]
    assert all(_text(messages[-1]).startswith(CONTEXT_START) for messages in requests)
    assert [_text(m) for m in requests[1]].count(_text(requests[0][-1])) == 1
    anonymous = rows.with_columns(
        pl.lit(None, pl.String).alias(c) for c in ("trajectory_id", "group_id")
    )
    for landed, expected in ((rows, trajectory), (anonymous, None)):
        steps = _steps(landed)
        assert steps["turn_id"].to_list() == rows["turn_id"].to_list()
        assert steps["trajectory_id"].n_unique() == 1
        if expected:
            assert steps["trajectory_id"][0] == expected
        else:
            assert steps["trajectory_inferred"].all()
        assert steps["prefix_break_reason"].to_list() == [None, "tail_edit"]
        first_prompt = rows["prompt_token_ids"][0].to_list()
        kept = steps["shared_prefix_tokens"][1]
        context_tokens = len(first_prompt) - kept
        assert 0 < context_tokens < 0.05 * len(first_prompt)
        assert rows["prompt_token_ids"][1].to_list()[:kept] == first_prompt[:kept]


def test_openclaw_calls_land_engine_exact_as_one_tail_edited_trajectory(
    capture_stack: CaptureStack, npm_cli: Callable[[NpmCli], InstalledCli], tmp_path: Path
) -> None:
    openclaw = npm_cli(OPENCLAW)
    trajectory, group = f"oc-{uuid.uuid4().hex[:8]}", "g-openclaw"
    identity = {"x-claw-trajectory": trajectory, "x-claw-group": group, "x-claw-agent": "openclaw"}
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".openclaw").mkdir(parents=True), work.mkdir()
    answers = []
    with Relay(capture_stack.proxy_url) as relay, OutboundGuard() as guard:
        config = openclaw_config(f"{relay.url}/v1", capture_stack.key, API, identity, work)
        (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config))
        env = {"NODE_USE_ENV_PROXY": "1"}  # Node's fetch then goes through the guard too
        for prompt in ("What is 17 + 25?", "What is 6 * 7?"):
            arguments = ["agent", "--local", "--session-id", trajectory, "--message", prompt]
            done = run_offline(openclaw, [*arguments, "--json"], home, work, guard, env)
            answers.append(json.loads(done.stdout)["payloads"][0]["text"])
    assert guard.attempts == []
    calls = model_calls(relay, "/v1/responses")
    rows = assert_landed_engine_exact(capture_stack, calls, trajectory, "responses")
    assert rows.height == len(calls) == 2  # one call per message: no side calls
    assert set(rows["group_id"]) == {group} and set(rows["agent"]) == {"openclaw"}
    assert answers == [text.strip() for text in rows["response_text"]]  # it trims replies
    assert_one_tail_edited_trajectory(rows, trajectory)
