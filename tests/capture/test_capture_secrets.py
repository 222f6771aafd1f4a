"""Secrets reach no table, no Delta log (file statistics quote values) and no log: keys glued to
other characters, a white-box step's finish reason, a backend error that echoes a key, and each
credential shape the scrubber knows planted on every route (ordinary look-alikes kept)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import openai
import polars as pl
import pytest
from proxy_calls import client_for, landed, post
from stack_fixtures import CaptureStack

from claw_pipelines.lake import Lake

LANDING_TABLES = ("turns", "rewards", "trajectory_events", "labels")


def glued_keys() -> dict[str, str]:
    """Keys written against other characters, by where they are glued; the key material is
    random hex, so each can be searched for everywhere afterwards."""
    return {
        "after underscore": f"api_key_sk-{secrets.token_hex(20)}",
        "after a letter": f"xsk-{secrets.token_hex(20)}",
        "after digits": f"42sk-proj-{secrets.token_hex(24)}",
    }


def key_material(glued: str) -> str:
    return glued.rsplit("-", 1)[1]


def assert_nowhere(lake: Lake, logs: Path, needles: list[str]) -> None:
    """No needle in any landing table's text, any table's Delta log, or any log file."""
    for table in LANDING_TABLES:
        scan = lake.scan(table)
        if scan is None:
            continue
        text = json.dumps(scan.select(pl.col(pl.String, pl.List(pl.String))).collect().to_dicts())
        for needle in needles:
            assert needle not in text, f"a secret is in the {table} table"
    delta_logs = [p for p in Path(lake.root).rglob("_delta_log/*.json")]
    assert delta_logs
    for path in [*delta_logs, *logs.glob("*.log")]:
        text = path.read_text(errors="replace")
        for needle in needles:
            assert needle not in text, f"a secret is in {path}"


def test_glued_keys_are_scrubbed_from_every_route(capture_stack: CaptureStack) -> None:
    keys = glued_keys()
    said = " and ".join(keys.values())
    tools = [{"type": "function", "function": {"name": "f", "description": said}}]
    raw = client_for(capture_stack).chat.completions.with_raw_response.create(
        model="policy",
        messages=[{"role": "user", "content": f"my keys: {said}. What is 1 + 1?"}],
        tools=tools,
        extra_body={"metadata": {"note": said, "nested": [{"deep": said}]}},
    )
    turn_id = raw.headers["x-litellm-call-id"]
    step = post(
        capture_stack,
        "/claw/v1/steps",
        json.dumps(
            {
                "prompt_token_ids": [1],
                "response_token_ids": [2],
                "finish_reason": f"stop {keys['after a letter']}",
                "response_text": said,
                "messages": [{"role": "user", "content": said}],
                "metadata": {"note": said},
            }
        ).encode(),
    )
    trajectory = f"secrets-{secrets.token_hex(4)}"
    reward = post(
        capture_stack,
        "/claw/v1/rewards",
        json.dumps({"trajectory_id": trajectory, "value": 1, "metadata": {"n": said}}).encode(),
    )
    complete = post(
        capture_stack,
        f"/claw/v1/trajectories/{trajectory}/complete",
        json.dumps({"metadata": {"n": said}}).encode(),
    )
    for answer in (step, reward, complete):
        assert answer.status_code == 200, answer.text
    rows = landed(capture_stack, [turn_id, step.json()["turn_id"]])
    white_box = rows.filter(pl.col("call_type") == "step").row(0, named=True)
    assert white_box["finish_reason"] == "stop x[REDACTED]"
    capture_stack.wait_for_rows(lambda df: trajectory in set(df["trajectory_id"]), "rewards")
    capture_stack.wait_for_rows(
        lambda df: trajectory in set(df["trajectory_id"]), "trajectory_events"
    )
    needles = [key_material(key) for key in keys.values()]
    assert_nowhere(capture_stack.lake, capture_stack.workdir / "logs", needles)


def test_a_backend_error_that_echoes_keys_lands_scrubbed(fake_backend_stack) -> None:
    """The backend quotes its own API key (nothing shaped like a secret: only the proxy config
    says it is one) and the user's message, which carries a glued key."""
    glued = glued_keys()["after underscore"]
    client = client_for(fake_backend_stack)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.with_raw_response.create(
            model="policy", messages=[{"role": "user", "content": f"echo error {glued}"}]
        )
    turn_id = raised.value.response.headers["x-litellm-call-id"]
    (row,) = landed(fake_backend_stack, [turn_id]).iter_rows(named=True)
    assert row["status"] == "error"
    assert "cannot serve" in row["error"] and "[REDACTED]" in row["error"]
    needles = [fake_backend_stack.backend_key, key_material(glued)]
    assert_nowhere(fake_backend_stack.lake, fake_backend_stack.workdir / "logs", needles)


def credential_shapes() -> dict[str, tuple[str, str]]:
    """Each shape with random material, as (text to plant, needle that must land nowhere)."""
    jwt_payload, aws_id = secrets.token_hex(12), "ASIA" + secrets.token_hex(8).upper()
    github, pat, aws_secret = secrets.token_hex(18), secrets.token_hex(20), secrets.token_hex(20)
    upper, key_key = secrets.token_hex(10), secrets.token_hex(12)
    jwt = f"eyJhbGciOiJIUzI1NiJ9.eyJ{jwt_payload}.{secrets.token_hex(8)}"
    return {
        "lower-case bearer JWT": (f"Authorization: bearer {jwt}", jwt_payload),
        "upper-case bearer": (f"AUTHORIZATION: BEARER {upper}", upper),
        "AWS temporary key id": (f"id {aws_id}", aws_id),
        "GitHub token": (f"ghp_{github}", github),
        "GitHub fine-grained token": (f"github_pat_11{pat}", pat),
        "AWS secret access key": (f"aws_secret_access_key={aws_secret}", aws_secret),
        "key used as a JSON key": (f"sk-proj-{key_key}", key_key),
    }


KEPT = "3fa85f64-5717-4562-b3fc-2c963f66afa6, and bearer tokens expire"


def _post(stack: CaptureStack, path: str, **body: object) -> httpx.Response:
    return post(stack, path, json.dumps(body).encode())


def test_each_credential_shape_lands_nowhere_from_any_route(capture_stack: CaptureStack) -> None:
    shapes = credential_shapes()
    said = " ; ".join(text for text, _ in shapes.values()) + " ; " + KEPT
    as_key = shapes["key used as a JSON key"][0]
    schema = {"type": "object", "properties": {as_key: {"type": "string", "description": said}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    chat = client_for(capture_stack).chat.completions.with_raw_response.create(
        model="policy",
        messages=[{"role": "user", "content": said}],
        tools=tools,
        extra_body={"metadata": {as_key: said, "note": {said: [said]}}},
    )
    responses = _post(capture_stack, "/v1/responses", model="policy", instructions=said, input=said)
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {as_key: said}}
    tool_result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": said}
    messages = [
        {"role": "user", "content": said},
        {"role": "assistant", "content": [tool_use]},
        {"role": "user", "content": [tool_result]},
    ]
    messages_call = _post(
        capture_stack, "/v1/messages", model="policy", max_tokens=16, system=said, messages=messages
    )
    trajectory = f"shapes-{secrets.token_hex(4)}"
    step = {
        "prompt_token_ids": [1],
        "response_token_ids": [2],
        "finish_reason": said,
        "response_text": said,
        "messages": [{"role": "user", "content": said}],
        "metadata": {as_key: said},
    }
    metadata = {as_key: said}
    answers = [
        _post(capture_stack, "/claw/v1/steps", **step),
        _post(
            capture_stack, "/claw/v1/rewards", trajectory_id=trajectory, value=1, metadata=metadata
        ),
        _post(capture_stack, f"/claw/v1/trajectories/{trajectory}/complete", metadata=metadata),
    ]
    for answer in [responses, messages_call, *answers]:
        assert answer.status_code == 200, answer.text
    turn_ids = [
        chat.headers["x-litellm-call-id"],
        responses.headers["x-litellm-call-id"],
        messages_call.headers["x-litellm-call-id"],
        answers[0].json()["turn_id"],
    ]
    rows = landed(capture_stack, turn_ids)
    assert rows.height == 4
    for row in rows.iter_rows(named=True):
        assert KEPT in (row["request_messages"] or "") + (row["response_text"] or ""), row["api"]
    for table in ("rewards", "trajectory_events"):
        capture_stack.wait_for_rows(lambda df: trajectory in set(df["trajectory_id"]), table)
    needles = [needle for _, needle in shapes.values()]
    assert_nowhere(capture_stack.lake, capture_stack.workdir / "logs", needles)
