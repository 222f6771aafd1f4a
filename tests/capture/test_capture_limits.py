"""What the proxy accepts, on every route, it keeps: rows of any size land; a body over the limit
is a 413; bad JSON (too deep, NaN, a lone surrogate) is a 400 naming the field; what is stored
is valid JSON."""

from __future__ import annotations

import json
import uuid

import httpx
import polars as pl
import pytest
from proxy_calls import client_for, landed, post
from stack_fixtures import CaptureStack

MIB = 2**20
LIMIT = 8 * MIB
"""The proxy's default body limit (CLAW_MAX_BODY_BYTES)."""
JSON_COLUMNS = {
    "turns": [
        "request_messages",
        "request_tools",
        "sampling_params",
        "response_message",
        "metadata",
    ],
    "rewards": ["metadata"],
    "trajectory_events": ["metadata"],
}


def _post_json(stack: CaptureStack, path: str, body: dict) -> httpx.Response:
    return post(stack, path, json.dumps(body).encode())


def _chat_body(metadata: dict | None = None, content: object = "What is 2 + 2?") -> dict:
    body = {"model": "policy", "messages": [{"role": "user", "content": content}]}
    return body if metadata is None else {**body, "metadata": metadata}


def _nested(depth: int) -> str:
    """JSON text of a string inside ``depth`` lists (built as text: ``json.dumps`` recurses)."""
    return "[" * depth + '"bottom"' + "]" * depth


def _chat_with(metadata_json: str) -> bytes:
    return (
        '{"model": "policy", "messages": [{"role": "user", "content": "hi"}], '
        f'"metadata": {metadata_json}}}'
    ).encode()


def _row(stack: CaptureStack, table: str, key: str, value: str) -> dict:
    rows = stack.wait_for_rows(lambda df: value in set(df[key]), table=table)
    return rows.filter(pl.col(key) == value).row(0, named=True)


@pytest.mark.parametrize("size", [int(2.5 * MIB), 7 * MIB], ids=["2.5MiB", "7MiB"])
def test_a_call_with_megabytes_of_metadata_lands(capture_stack: CaptureStack, size: int) -> None:
    """Over the spool decoder's old 1 MiB JSON block, under the body limit."""
    blob = "m" * size
    response = _post_json(capture_stack, "/v1/chat/completions", _chat_body({"blob": blob}))
    assert response.status_code == 200, response.text[:300]
    (row,) = landed(capture_stack, [response.headers["x-litellm-call-id"]]).iter_rows(named=True)
    assert json.loads(row["metadata"]) == {"blob": blob}


def test_claw_endpoints_land_megabyte_rows(capture_stack: CaptureStack) -> None:
    blob = "r" * (3 * MIB)
    step = _post_json(
        capture_stack,
        "/claw/v1/steps",
        {"prompt_token_ids": [1, 2], "response_token_ids": [3], "response_text": blob},
    )
    reward = _post_json(
        capture_stack,
        "/claw/v1/rewards",
        {"trajectory_id": f"big-{uuid.uuid4().hex}", "value": 1.0, "metadata": {"blob": blob}},
    )
    trajectory = f"big-{uuid.uuid4().hex}"
    complete = _post_json(
        capture_stack, f"/claw/v1/trajectories/{trajectory}/complete", {"metadata": {"b": blob}}
    )
    for answer in (step, reward, complete):
        assert answer.status_code == 200, answer.text[:300]
    turn = _row(capture_stack, "turns", "turn_id", step.json()["turn_id"])
    assert turn["response_text"] == blob
    rewarded = _row(capture_stack, "rewards", "reward_id", reward.json()["reward_id"])
    assert json.loads(rewarded["metadata"]) == {"blob": blob}
    event = _row(capture_stack, "trajectory_events", "trajectory_id", trajectory)
    assert json.loads(event["metadata"]) == {"b": blob}


def test_a_3_mib_answer_from_the_backend_lands(fake_backend_stack: CaptureStack) -> None:
    size = 3 * MIB
    client = client_for(fake_backend_stack)
    raw = client.chat.completions.with_raw_response.create(
        model="policy", messages=[{"role": "user", "content": f"big {size}"}]
    )
    completion = raw.parse()
    assert len(completion.choices[0].message.content) == size
    (row,) = landed(fake_backend_stack, [raw.headers["x-litellm-call-id"]]).iter_rows(named=True)
    assert len(row["response_text"]) == size
    assert row["response_token_ids"] == list(range(100, 108))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("PUT", "/v1/chat/completions"),
        ("PATCH", "/key/update"),
        ("POST", "/claw/v1/steps"),
        ("POST", "/claw/v1/rewards"),
        ("POST", "/claw/v1/trajectories/t-oversize/complete"),
    ],
)
def test_a_body_over_the_limit_is_refused_on_every_route(
    capture_stack: CaptureStack, method: str, path: str
) -> None:
    body = json.dumps({"metadata": {"blob": "x" * LIMIT}}).encode()
    response = httpx.request(
        method,
        capture_stack.proxy_url + path,
        content=body,
        headers={"authorization": f"Bearer {capture_stack.key}"},
        timeout=60,
    )
    assert response.status_code == 413, response.text[:300]
    assert f"request body exceeds {LIMIT} bytes" in response.text


BAD_BODIES = {
    "chat content NaN": (
        "/v1/chat/completions",
        b'{"model": "policy", "messages": [{"role": "user", "content": NaN}]}',
        "messages[0].content",
    ),
    "chat metadata 900 deep": (
        "/v1/chat/completions",
        _chat_with(f'{{"deep": {_nested(900)}}}'),
        "metadata.deep",
    ),
    "chat metadata 10000 deep": (
        "/v1/chat/completions",
        _chat_with(f'{{"deep": {_nested(10_000)}}}'),
        "nested deeper than",
    ),
    "chat lone surrogate": (
        "/v1/chat/completions",
        b'{"model": "policy", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "messages[0].content",
    ),
    "step response_text lone surrogate": (
        "/claw/v1/steps",
        b'{"prompt_token_ids": [1], "response_token_ids": [2], "response_text": "\\udc00"}',
        "response_text",
    ),
    "step messages 10000 deep": (
        "/claw/v1/steps",
        (
            '{"prompt_token_ids": [1], "response_token_ids": [2], '
            f'"messages": [{_nested(10_000)}]}}'
        ).encode(),
        "nested deeper than",
    ),
    "step logprob beyond float32": (
        "/claw/v1/steps",
        b'{"prompt_token_ids": [1], "response_token_ids": [2], "response_logprobs": [-1e300]}',
        "response_logprobs",
    ),
    "reward metadata NaN": (
        "/claw/v1/rewards",
        b'{"trajectory_id": "t-nan-metadata", "value": 1, "metadata": {"score": NaN}}',
        "metadata.score",
    ),
    "completion metadata 900 deep": (
        "/claw/v1/trajectories/t-deep/complete",
        f'{{"metadata": {{"deep": {_nested(900)}}}}}'.encode(),
        "metadata.deep",
    ),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_json_is_a_400_naming_the_field(capture_stack: CaptureStack, case: str) -> None:
    path, body, named = BAD_BODIES[case]
    response = post(capture_stack, path, body)
    assert response.status_code == 400, f"{response.status_code} {response.text[:300]}"
    assert named in response.text


def test_everything_stored_is_valid_json(capture_stack: CaptureStack) -> None:
    """Runs last in this module: every JSON column of every row landed so far (by this module
    and the others sharing the stack) parses as strict JSON, and no logprob is infinite."""
    edge_values = {"tiny": 5e-324, "huge": 1.7e308, "astral": "\U0001f600", "pair": "\ud83d\ude00"}
    accepted = _post_json(capture_stack, "/v1/chat/completions", _chat_body(edge_values))
    assert accepted.status_code == 200, accepted.text[:300]
    landed(capture_stack, [accepted.headers["x-litellm-call-id"]])

    def strict(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    for table, columns in JSON_COLUMNS.items():
        rows = capture_stack.rows(table)
        for column in columns:
            for text in rows[column].drop_nulls():
                json.loads(text, parse_constant=strict)
    logprobs = capture_stack.rows("turns")["response_logprobs"].drop_nulls()
    assert logprobs.list.eval(pl.element().is_finite().all()).list.first().all()
