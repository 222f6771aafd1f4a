"""The real LiteLLM proxy + embedded engine: what agents send lands in Delta exactly once."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import polars as pl
import pytest
from proxy_calls import QUESTION, assert_matches_engine, chat, client_for, landed, post
from stack_fixtures import CaptureStack

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def test_the_proxy_writes_its_config_in_its_own_run_folder(capture_stack: CaptureStack) -> None:
    """Not in ``<workdir>/.claw/run``: the proxy runs from its workdir (``.claw`` under claw up)."""
    assert list((capture_stack.workdir / "run").glob("litellm-*.yaml"))
    assert not (capture_stack.workdir / ".claw").exists()


def test_non_streaming_turns_land_with_the_engines_exact_ids(capture_stack: CaptureStack) -> None:
    client = client_for(capture_stack)
    calls = [chat(client, max_tokens=64, extra_body={"return_token_ids": True}) for _ in range(5)]
    rows = landed(capture_stack, [turn_id for turn_id, _ in calls])
    assert rows.height == 5
    by_id = {row["turn_id"]: row for row in rows.iter_rows(named=True)}
    for turn_id, completion in calls:
        row = by_id[turn_id]
        assert row["stream"] is False and row["status"] == "success"
        assert completion.model_extra["prompt_token_ids"] == row["prompt_token_ids"]
        assert_matches_engine(capture_stack, row, completion.id)


def test_streamed_turns_land_with_the_engines_exact_ids(capture_stack: CaptureStack) -> None:
    client = client_for(capture_stack)
    seen = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="policy",
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
        chunks = list(raw.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        prompt_ids = chunks[0].model_extra["prompt_token_ids"]
        seen.append((raw.headers["x-litellm-call-id"], chunks[0].id, text, prompt_ids))
    rows = landed(capture_stack, [s[0] for s in seen])
    by_id = {row["turn_id"]: row for row in rows.iter_rows(named=True)}
    for turn_id, response_id, text, prompt_ids in seen:
        row = by_id[turn_id]
        assert row["stream"] is True
        assert row["prompt_token_ids"] == prompt_ids
        assert (row["response_text"] or "") == text
        assert row["first_token_at"] == row["ended_at"]  # a buffered stream arrives at once
        assert_matches_engine(capture_stack, row, response_id)


def test_tool_calling_trajectory_by_path_prefix(capture_stack: CaptureStack) -> None:
    """A multi-turn tool trajectory identified only by base_url; its prompts extend each other."""
    trajectory, group = f"traj-{uuid.uuid4().hex[:8]}", "group-tools"
    client = client_for(capture_stack, f"/t/{trajectory}/{group}/v1")
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    turn_ids = []
    tool_turn = None
    for _ in range(12):
        turn_id, completion = chat(client, messages=messages, tools=[CALCULATOR])
        turn_ids.append(turn_id)
        message = completion.choices[0].message
        if message.tool_calls:
            tool_turn = turn_id
            messages.append(
                message.model_dump(exclude_none=True, exclude={"provider_specific_fields"})
            )
            call = message.tool_calls[0]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
            continue
        if tool_turn is not None:
            break
        messages = [{"role": "user", "content": QUESTION}]
    assert tool_turn is not None, "the simulated policy never called the calculator"
    rows = landed(capture_stack, turn_ids).sort("started_at")
    assert set(rows["trajectory_id"]) == {trajectory}
    assert set(rows["group_id"]) == {group}
    tool_row = rows.filter(pl.col("turn_id") == tool_turn).row(0, named=True)
    assert tool_row["finish_reason"] == "tool_calls"
    assert [json.loads(tools) for tools in rows["request_tools"]] == [[CALCULATOR]] * rows.height
    tool_call = json.loads(tool_row["response_message"])["tool_calls"][0]
    assert tool_call["function"]["name"] == "calculator"
    after = rows.filter(pl.col("started_at") > tool_row["started_at"]).row(0, named=True)
    previous = tool_row["prompt_token_ids"] + tool_row["response_token_ids"]
    assert after["prompt_token_ids"][: len(previous)] == previous


def test_each_choice_of_an_n_call_lands_as_its_own_rollout(capture_stack: CaptureStack) -> None:
    """``n = 3`` samples three rollouts of one task: trajectories t, t.1, t.2 of one group."""
    trajectory, group = f"traj-{uuid.uuid4().hex[:8]}", "group-n"
    client = client_for(capture_stack, f"/t/{trajectory}/{group}/v1")
    call_id, completion = chat(client, n=3, max_tokens=32)
    rows = landed(capture_stack, [call_id, f"{call_id}.1", f"{call_id}.2"]).sort("turn_id")
    assert rows["trajectory_id"].to_list() == [trajectory, f"{trajectory}.1", f"{trajectory}.2"]
    assert set(rows["group_id"]) == {group}
    sent = {
        entry["index"]: entry
        for line in capture_stack.engine_log.read_text().splitlines()
        if (entry := json.loads(line))["id"] == completion.id
    }
    for index, row in enumerate(rows.iter_rows(named=True)):
        assert row["prompt_token_ids"] == sent[index]["prompt_token_ids"]
        assert row["response_token_ids"] == sent[index]["token_ids"]
        assert row["response_text"] == completion.choices[index].message.content


def test_path_prefix_ids_are_percent_decoded_once(capture_stack: CaptureStack) -> None:
    """``%2F`` is a slash inside the id (not a path separator), ``%2541`` stays ``%41`` and
    UTF-8 (``%C3%A9``) is text."""
    turn_id, _ = chat(client_for(capture_stack, "/t/pd-a%2Fb%2541/g%20x%C3%A9/v1"))
    row = landed(capture_stack, [turn_id]).row(0, named=True)
    assert (row["trajectory_id"], row["group_id"]) == ("pd-a/b%41", "g xé")


def test_identity_from_headers_and_metadata(capture_stack: CaptureStack) -> None:
    by_headers = client_for(
        capture_stack,
        **{
            "x-claw-trajectory": "traj-h",
            "x-claw-group": "group-h",
            "x-claw-policy-version": "7",
            "x-claw-channel": "eval",
            "x-claw-agent": "solver",
        },
    )
    header_turn, _ = chat(by_headers)
    metadata = {"claw": {"trajectory_id": "traj-m", "group_id": "group-m", "ground_truth": "42"}}
    metadata_turn, _ = chat(client_for(capture_stack), extra_body={"metadata": metadata})
    anonymous_turn, _ = chat(client_for(capture_stack))
    rows = {
        r["turn_id"]: r
        for r in landed(capture_stack, [header_turn, metadata_turn, anonymous_turn]).iter_rows(
            named=True
        )
    }
    assert (rows[header_turn]["trajectory_id"], rows[header_turn]["group_id"]) == (
        "traj-h",
        "group-h",
    )
    assert rows[header_turn]["policy_version"] == 7
    assert (rows[header_turn]["channel"], rows[header_turn]["agent"]) == ("eval", "solver")
    assert rows[metadata_turn]["trajectory_id"] == "traj-m"
    assert json.loads(rows[metadata_turn]["metadata"]) == {"claw": {"ground_truth": "42"}}
    assert rows[anonymous_turn]["trajectory_id"] is None


def test_planted_secrets_reach_no_table_and_no_log(capture_stack: CaptureStack) -> None:
    planted = "sk-planted-" + uuid.uuid4().hex
    client = client_for(capture_stack, **{"x-api-key": planted})
    turn_id, _ = chat(
        client,
        messages=[{"role": "user", "content": f"my key is {planted}. {QUESTION}"}],
        extra_body={"metadata": {"api_key": planted, "note": f"Bearer {planted}"}},
    )
    rows = landed(capture_stack, [turn_id])
    assert rows.height == 1
    for secret in (planted, capture_stack.key):
        for table in ("turns", "rewards", "trajectory_events", "labels"):
            scan = capture_stack.lake.scan(table)
            if scan is None:
                continue
            text = json.dumps(
                scan.collect().select(pl.col(pl.String, pl.List(pl.String))).to_dicts()
            )
            assert secret not in text, f"secret found in {table}"
        for log in (capture_stack.workdir / "logs").glob("*.log"):
            assert secret not in log.read_text(errors="replace"), f"secret found in {log.name}"


def test_bad_input_gets_a_clear_error_and_loses_nothing(capture_stack: CaptureStack) -> None:
    kept_turn, _ = chat(client_for(capture_stack))
    landed(capture_stack, [kept_turn])
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
    cases = {
        "malformed json": (
            post(capture_stack, "/v1/chat/completions", b'{"model": "policy",'),
            400,
        ),
        "non utf-8": (post(capture_stack, "/v1/chat/completions", b'{"model": "\xff\xfe"}'), 400),
        "oversize": (
            post(capture_stack, "/v1/chat/completions", b"{" + b" " * (9 * 2**20) + b"}"),
            413,
        ),
        "unknown identity": (
            post(capture_stack, "/v1/chat/completions", body, **{"x-claw-trajectroy": "t"}),
            400,
        ),
        "bad policy version": (
            post(capture_stack, "/v1/chat/completions", body, **{"x-claw-policy-version": "v1"}),
            400,
        ),
        "float policy version": (
            post(capture_stack, "/v1/chat/completions", body, **{"x-claw-policy-version": "1.0"}),
            400,
        ),
        "json array": (post(capture_stack, "/v1/chat/completions", b"[1, 2, 3]"), 400),
        "json string": (post(capture_stack, "/v1/chat/completions", b'"hello"'), 400),
        "no key": (httpx.post(capture_stack.proxy_url + "/v1/chat/completions", content=body), 401),
    }
    for name, (response, status) in cases.items():
        assert response.status_code == status, (
            f"{name}: {response.status_code} {response.text[:200]}"
        )
        assert response.text, name
    assert "not valid JSON" in cases["malformed json"][0].text
    assert "x-claw-trajectroy" in cases["unknown identity"][0].text
    after_turn, _ = chat(client_for(capture_stack))
    rows = landed(capture_stack, [kept_turn, after_turn])
    assert rows.height == 2


def test_backend_error_lands_an_error_row(capture_stack: CaptureStack) -> None:
    client = client_for(capture_stack)
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.with_raw_response.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], temperature=-1
        )
    error_id = raised.value.response.headers.get("x-litellm-call-id")
    assert error_id
    rows = landed(capture_stack, [error_id])
    row = rows.row(0, named=True)
    assert row["status"] == "error" and row["error"]
    assert row["prompt_token_ids"] is None and row["token_source"] == "none"


def test_lifecycle_reward_and_step_endpoints(capture_stack: CaptureStack) -> None:
    turn_id, _ = chat(client_for(capture_stack, "/t/traj-life/group-life/v1"))
    complete = post(
        capture_stack,
        "/claw/v1/trajectories/traj-life/complete",
        json.dumps({"reward": 1.0, "group_id": "group-life"}).encode(),
    )
    assert complete.status_code == 200, complete.text
    no_body = post(capture_stack, "/claw/v1/trajectories/traj-no-body/complete", b"")
    assert no_body.status_code == 200, no_body.text
    reward = post(
        capture_stack,
        "/claw/v1/rewards",
        json.dumps({"turn_id": turn_id, "value": 0.5, "name": "judge", "source": "model"}).encode(),
    )
    assert reward.status_code == 200, reward.text
    step = post(
        capture_stack,
        "/claw/v1/steps",
        json.dumps(
            {
                "trajectory_id": "traj-white",
                "prompt_token_ids": [1, 2, 3],
                "response_token_ids": [4, 5],
                "response_logprobs": [-0.1, -0.2],
            }
        ).encode(),
    )
    assert step.status_code == 200, step.text
    assert step.headers["x-litellm-call-id"] == step.json()["turn_id"]
    two_targets = post(
        capture_stack,
        "/claw/v1/rewards",
        json.dumps({"turn_id": "a", "trajectory_id": "b", "value": 1}).encode(),
    )
    assert two_targets.status_code == 400
    (problem,) = two_targets.json()["problems"]  # the same shape as any invalid body
    assert "exactly one of turn_id, trajectory_id, group_id" in problem["msg"]
    assert (
        httpx.post(capture_stack.proxy_url + "/claw/v1/rewards", json={"value": 1}).status_code
        == 401
    )

    white = landed(capture_stack, [step.json()["turn_id"]]).row(0, named=True)
    assert white["call_type"] == "step" and white["response_token_ids"] == [4, 5]
    events = capture_stack.wait_for_rows(
        lambda df: "traj-life" in set(df["trajectory_id"]), "trajectory_events"
    ).filter(pl.col("trajectory_id") == "traj-life")
    rewards = capture_stack.wait_for_rows(
        lambda df: turn_id in set(df["turn_id"]), "rewards"
    ).filter(pl.col("turn_id") == turn_id)
    assert events.row(0, named=True)["reward"] == 1.0
    assert rewards.row(0, named=True)["source"] == "model"


def test_a_white_box_step_takes_its_identity_like_a_call(capture_stack: CaptureStack) -> None:
    """The base-URL prefix and x-claw-* headers name a step's trajectory as they do a call's."""
    step = json.dumps(
        {"prompt_token_ids": [1], "response_token_ids": [2], "group_id": "g-body"}
    ).encode()
    by_prefix = post(capture_stack, "/t/traj-wb-prefix/g-prefix/claw/v1/steps", step)
    by_headers = post(
        capture_stack,
        "/claw/v1/steps",
        step,
        **{"x-claw-trajectory": "traj-wb-header", "x-claw-policy-version": "3"},
    )
    unknown = post(capture_stack, "/claw/v1/steps", step, **{"x-claw-trajectroy": "t"})
    assert unknown.status_code == 400 and "x-claw-trajectroy" in unknown.text
    turn_ids = [by_prefix.json()["turn_id"], by_headers.json()["turn_id"]]
    rows = landed(capture_stack, turn_ids)
    identity = {
        row["turn_id"]: (row["trajectory_id"], row["group_id"], row["policy_version"])
        for row in rows.iter_rows(named=True)
    }
    assert identity == {
        turn_ids[0]: ("traj-wb-prefix", "g-prefix", None),
        turn_ids[1]: ("traj-wb-header", "g-body", 3),
    }


def test_text_completion_turns_land_with_the_engines_exact_ids(
    capture_stack: CaptureStack,
) -> None:
    client = client_for(capture_stack)
    raw = client.completions.with_raw_response.create(
        model="policy", prompt=QUESTION, max_tokens=16, extra_body={"return_token_ids": True}
    )
    streamed = client.completions.with_raw_response.create(
        model="policy", prompt=QUESTION, max_tokens=16, stream=True
    )
    chunks = list(streamed.parse())
    turn_ids = [raw.headers["x-litellm-call-id"], streamed.headers["x-litellm-call-id"]]
    rows = {r["turn_id"]: r for r in landed(capture_stack, turn_ids).iter_rows(named=True)}
    completion = raw.parse()
    row = rows[turn_ids[0]]
    assert row["call_type"] == "completion"
    assert json.loads(row["request_messages"]) == [{"role": "user", "content": QUESTION}]
    assert row["response_text"] == completion.choices[0].text
    assert row["prompt_token_ids"] == completion.choices[0].model_extra["prompt_token_ids"]
    assert_matches_engine(capture_stack, row, completion.id)
    row = rows[turn_ids[1]]
    assert row["stream"] is True
    assert row["response_text"] == "".join(c.choices[0].text for c in chunks if c.choices)
    assert_matches_engine(capture_stack, row, chunks[0].id)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/claw/v1/rewards", b'{"trajectory_id": "t-nan", "value": NaN}', "value"),
        ("/claw/v1/rewards", b'{"trajectory_id": "t-big", "value": 1e999}', "value"),
        ("/claw/v1/trajectories/t-inf/complete", b'{"reward": Infinity}', "reward"),
        (
            "/claw/v1/steps",
            b'{"prompt_token_ids": [1], "response_token_ids": [2], "response_logprobs": [NaN]}',
            "response_logprobs",
        ),
        (
            "/claw/v1/steps",
            b'{"prompt_token_ids": [1], "response_token_ids": [2], "response_logprobs": [0.5]}',
            "response_logprobs",
        ),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_field(
    capture_stack: CaptureStack, path: str, body: bytes, field: str
) -> None:
    response = post(capture_stack, path, body)
    assert response.status_code == 400, response.text
    assert field in response.text


def test_a_client_call_id_header_never_becomes_the_turn_id(capture_stack: CaptureStack) -> None:
    """Calls sharing an ``x-litellm-call-id`` still land one row each, with their own content."""
    questions = [f"What is {i} + {i}?" for i in range(6)]

    async def ask(client: httpx.AsyncClient, question: str) -> str:
        response = await client.post(
            capture_stack.proxy_url + "/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": question}]},
            headers={"authorization": f"Bearer {capture_stack.key}", "x-litellm-call-id": "same"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        return response.headers["x-litellm-call-id"]

    async def ask_all() -> list[str]:
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(ask(client, q) for q in questions))

    turn_ids = asyncio.run(ask_all())
    assert len(set(turn_ids)) == len(questions) and "same" not in turn_ids
    rows = landed(capture_stack, turn_ids)
    assert rows.height == len(questions)
    for turn_id, question in zip(turn_ids, questions, strict=True):
        row = rows.filter(pl.col("turn_id") == turn_id).row(0, named=True)
        assert json.loads(row["request_messages"]) == [{"role": "user", "content": question}]


def test_a_call_the_engine_rejects_does_not_bench_the_deployment(
    capture_stack: CaptureStack,
) -> None:
    """The embedded engine has no /v1/embeddings: its 404 must not put `policy` in cooldown."""
    rejected = post(capture_stack, "/v1/embeddings", b'{"model": "policy", "input": "hi"}')
    assert rejected.status_code == 404, rejected.text
    chat(client_for(capture_stack))
