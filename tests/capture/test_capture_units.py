"""Pure parts of the capture path: redaction, identity, path prefix, re-streaming, spool."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import secrets
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from fastapi.testclient import TestClient
from pydantic import ValidationError

from claw_pipelines.capture import json_text
from claw_pipelines.capture.asked_fields import AskedFields, ask_for_capture, withhold_unasked
from claw_pipelines.capture.request_body import BodyRejected, parse_json_object
from claw_pipelines.capture.runtime import CaptureRuntime, ModelCapture
from claw_pipelines.capture.stream_turns import StreamAccumulator
from claw_pipelines.capture.turns import (
    UnusableAnswer,
    pending_call,
    turns_from_response,
)
from claw_pipelines.edge.asgi import CaptureApp
from claw_pipelines.edge.control import RewardIn, StepIn, build_control_app
from claw_pipelines.edge.frozen_heap import PlainProxy
from claw_pipelines.edge.launcher import (
    DEFAULT_CONFIG,
    ProxyStartError,
    render_config,
    resolve_master_key,
    run_proxy,
    served_model,
)
from claw_pipelines.edge.restream import sse_from_completion
from claw_pipelines.identity import (
    IdentityError,
    TurnIdentity,
    identity_from_request,
    split_identity_prefix,
)
from claw_pipelines.lake import Lake
from claw_pipelines.lake.store import LakeStoreError
from claw_pipelines.processes import free_port
from claw_pipelines.redaction import REDACTED, Redactor, names_a_secret
from claw_pipelines.settings import LOCAL_MASTER_KEY, ClawSettings


def test_redactor_scrubs_credential_keys_and_values() -> None:
    redactor = Redactor(["my-master-key-123"])
    scrubbed = redactor.data(
        {
            "Authorization": "Bearer abcdefgh123",
            "nested": {"api_key": "x", "note": "use sk-live-abcdef123456 now"},
            "messages": [{"content": "the key is my-master-key-123"}],
            "prompt_token_ids": [1, 2],
        }
    )
    assert scrubbed["Authorization"] == REDACTED
    assert scrubbed["nested"]["api_key"] == REDACTED
    assert "sk-live" not in scrubbed["nested"]["note"]
    assert "my-master-key-123" not in json.dumps(scrubbed)
    assert scrubbed["prompt_token_ids"] == [1, 2]


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("api_key_sk-0a1b2c3d4e5f6a7b8c9d", "api_key_[REDACTED]"),
        ("xsk-proj-4fQx9ZkLm2PaT7rW8eYc1Vb3", "x[REDACTED]"),
        ("42sk-ant-api03-AbCdEf0123456789xyz", "42[REDACTED]"),
        ("keyAKIAIOSFODNN7EXAMPLE!", "key[REDACTED]!"),
        ("auth_Bearer abcdef123456", "auth_[REDACTED]"),
        ("use sk-live-abcdef123456 now", "use [REDACTED] now"),
    ],
)
def test_keys_glued_to_other_characters_are_scrubbed(text: str, scrubbed: str) -> None:
    assert Redactor().text(text) == scrubbed


@pytest.mark.parametrize(
    "text",
    ["task-3fa85f64-5717-4562-b3fc-2c963f66afa6", "risk-averse", "desk-lamp-model-x1", "sk-learn"],
)
def test_words_and_ids_glued_to_sk_are_kept(text: str) -> None:
    """Not key material after ``sk-``: no run of 16 letters and digits with a digit in it."""
    assert Redactor().text(text) == text


@pytest.mark.parametrize(
    ("key", "named"),
    [("api_key", True), ("X-Api-Key", True), ("client_secret", True), ("content", False)],
)
def test_keys_naming_a_credential(key: str, named: bool) -> None:
    assert names_a_secret(key) is named
    assert names_a_secret(key) is named  # again, from the cache


def test_identity_headers_win_over_metadata() -> None:
    identity = identity_from_request(
        {"x-claw-trajectory": "t-h", "x-claw-policy-version": "3"},
        {"trajectory_id": "t-m", "group_id": "g-m", "ground_truth": "4"},
    )
    assert identity.trajectory_id == "t-h"
    assert identity.group_id == "g-m"
    assert identity.policy_version == 3


def test_identity_headers_sent_as_utf8_keep_their_text() -> None:
    as_received = "rollout-é/ü".encode().decode("latin-1")  # how the server decodes header bytes
    identity = identity_from_request({"x-claw-trajectory": as_received}, None)
    assert identity.trajectory_id == "rollout-é/ü"


@pytest.mark.parametrize(
    ("headers", "metadata", "message"),
    [
        ({"x-claw-policy-version": "v2"}, None, "policy_version"),
        ({"x-claw-policy-version": "1.0"}, None, "policy_version"),
        ({"x-claw-policy-version": str(2**63)}, None, "policy_version"),
        ({}, {"policy_version": True}, "policy_version"),
        ({"x-claw-trajectroy": "t"}, None, "unknown identity header"),
        ({}, {"trajectory_id": "a" * 300}, "trajectory_id"),
        ({}, "not-an-object", "metadata.claw"),
        ({"x-claw-agent": "sk-agent-secret-123"}, None, "agent: .*secret"),
    ],
)
def test_identity_rejects_bad_values(headers: dict, metadata: object, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        identity_from_request(headers, metadata)  # type: ignore[arg-type]


def test_sampling_params_are_scrubbed() -> None:
    secret = "sk-sampling-secret-123"
    request = {
        "model": "m",
        "messages": [],
        "stop": [secret],
        "temperature": f"hot {secret}",
        "response_format": {"type": "json_schema", "json_schema": {"description": secret}},
    }
    pending = pending_call("c", request, TurnIdentity(), None, False, Redactor())
    assert pending.sampling_params and secret not in pending.sampling_params


def test_declared_tools_land_with_the_turn_scrubbed() -> None:
    secret = "sk-tool-secret-123"
    tools = [{"type": "function", "function": {"name": "calc", "description": f"key {secret}"}}]
    request = {"model": "m", "messages": [], "tools": tools}
    pending = pending_call("c", request, TurnIdentity(), None, False, Redactor())
    response = {"model": "m", "choices": [{"message": {"content": "4"}}]}
    (landed,) = turns_from_response(pending, response, Redactor(), "w")
    assert landed.request_tools and secret not in landed.request_tools
    assert json.loads(landed.request_tools)[0]["function"]["name"] == "calc"
    no_tools = pending_call("c", {"model": "m", "messages": []}, TurnIdentity(), None, False,
                            Redactor())  # fmt: skip
    assert no_tools.request_tools is None


def test_stored_names_that_look_like_secrets_are_refused() -> None:
    with pytest.raises(ValidationError, match="name"):
        RewardIn(trajectory_id="t", value=1.0, name="sk-reward-name-123")
    with pytest.raises(ValidationError, match="model"):
        StepIn(prompt_token_ids=[1], response_token_ids=[2], model="sk-model-name-123")


def test_identity_prefix_is_split_and_decoded() -> None:
    assert split_identity_prefix("/t/traj%201/g1/v1/chat/completions") == (
        "traj 1",
        "g1",
        "/v1/chat/completions",
    )
    assert split_identity_prefix("/t/a%2Fb%2541/g/v1/x%20y") == ("a/b%41", "g", "/v1/x%20y")
    assert split_identity_prefix("/v1/chat/completions") is None
    assert split_identity_prefix("/t//g/v1") is None


def test_master_key_rules() -> None:
    assert resolve_master_key("127.0.0.1", None) == LOCAL_MASTER_KEY
    with pytest.raises(ProxyStartError):
        resolve_master_key("0.0.0.0", None)
    with pytest.raises(ProxyStartError):
        resolve_master_key("0.0.0.0", LOCAL_MASTER_KEY)
    strong = "sk-" + secrets.token_urlsafe(32)
    assert resolve_master_key("0.0.0.0", strong) == strong
    for weak in ("k" * 23, "sk-" + "x" * 40, "password" * 3, "abc" * 8):
        with pytest.raises(ProxyStartError, match="weak"):
            resolve_master_key("0.0.0.0", weak)


def test_restream_carries_prompt_and_response_ids() -> None:
    completion = {
        "id": "c1",
        "created": 1,
        "model": "m",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]},
                "provider_specific_fields": {"token_ids": [7], "stop_reason": None},
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
    events = sse_from_completion(completion, include_usage=True).decode().split("\n\n")
    chunks = [json.loads(e.removeprefix("data: ")) for e in events if e and e != "data: [DONE]"]
    assert chunks[0]["prompt_token_ids"] == [1, 2]
    assert chunks[1]["choices"][0]["token_ids"] == [7]
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[3]["usage"]["total_tokens"] == 3
    assert events[-2] == "data: [DONE]"


def test_passthrough_text_completion_stream_keeps_its_text() -> None:
    accumulator = StreamAccumulator()
    for text in ("4", "2"):
        accumulator.add({"model": "m", "choices": [{"index": 0, "text": text}]})
    pending = pending_call(
        "c", {"model": "m", "prompt": "q"}, TurnIdentity(), None, True, Redactor()
    )
    (turn,) = accumulator.turns(pending, Redactor(), "w")
    assert turn.response_text == "42"


def _streamed_token(text: str, token_id: int | None, finish: str | None = None) -> dict:
    """A passthrough chunk as LiteLLM yields it: one token's logprob, its ID when kept."""
    choice: dict = {
        "index": 0,
        "delta": {"content": text},
        "logprobs": {"content": [{"token": text, "logprob": -0.5}]},
        "finish_reason": finish,
    }
    if token_id is not None:
        choice["token_ids"] = [token_id]
    return {"model": "m", "choices": [choice]}


@pytest.mark.parametrize(
    ("last_token_id", "expected_ids"), [(9, [7, 8, 9]), (None, None)], ids=["kept", "dropped"]
)
def test_passthrough_stream_lands_only_complete_response_ids(
    last_token_id: int | None, expected_ids: list[int] | None
) -> None:
    """LiteLLM drops the IDs of a final chunk without text (vLLM's end of sequence) but keeps its
    logprob: a partial ID list would misalign with the logprobs, so the IDs are unknown."""
    accumulator = StreamAccumulator()
    accumulator.add(_streamed_token("4", 7))
    accumulator.add(_streamed_token("2", 8))
    accumulator.add(_streamed_token("", last_token_id, finish="stop"))
    pending = pending_call("c", {"model": "m"}, TurnIdentity(), None, True, Redactor())
    (turn,) = accumulator.turns(pending, Redactor(), "w")
    assert turn.response_token_ids == expected_ids
    assert turn.response_logprobs == [-0.5, -0.5, -0.5]
    assert turn.response_text == "42"


def test_each_choice_counts_its_own_completion_tokens() -> None:
    response = {
        "model": "m",
        "prompt_token_ids": [1, 2],
        "usage": {"prompt_tokens": 2, "completion_tokens": 5},
        "choices": [
            {"message": {"content": "a"}, "token_ids": [3, 4]},
            {"message": {"content": "b"}, "token_ids": [5, 6, 7]},
        ],
    }
    pending = pending_call("c", {"model": "m", "n": 2}, TurnIdentity(), None, False, Redactor())
    turns = turns_from_response(pending, response, Redactor(), "w")
    assert [t.completion_tokens for t in turns] == [2, 3]
    assert [t.prompt_tokens for t in turns] == [2, 2]


@pytest.mark.parametrize(
    ("request_body", "asked"),
    [
        ({}, AskedFields(token_ids=False, logprobs=False)),
        ({"logprobs": False, "return_token_ids": False}, AskedFields(False, False)),
        ({"logprobs": True}, AskedFields(token_ids=False, logprobs=True)),
        ({"prompt": "x", "logprobs": 0}, AskedFields(token_ids=False, logprobs=True)),
        ({"return_token_ids": True}, AskedFields(token_ids=True, logprobs=False)),
    ],
)
def test_what_an_agent_asked_for_is_read_before_capture_asks(
    request_body: dict, asked: AskedFields
) -> None:
    """A text completion's ``logprobs: 0`` asks for the chosen tokens' logprobs (and capture
    keeps it 0); ``false`` and absent ask for nothing."""
    assert AskedFields.of(request_body) == asked
    sent = dict(request_body)
    ask_for_capture(sent, ModelCapture(return_token_ids=True, logprobs=True, top_logprobs=2))
    assert sent["return_token_ids"] is True
    assert sent["logprobs"] == (request_body["logprobs"] if asked.logprobs else True)
    assert sent.get("top_logprobs") == (None if asked.logprobs else 2)


def test_an_answer_keeps_only_the_engine_fields_its_agent_asked_for() -> None:
    """Per choice too (a text completion's ``prompt_token_ids``); what the agent asked for
    stays, and the provider's ``token_ids`` reads as when the engine sent none."""
    answer = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "text": "a",
                "prompt_token_ids": [1, 2],
                "token_ids": [3],
                "logprobs": {"token_logprobs": [-0.1]},
                "provider_specific_fields": {"token_ids": [3], "stop_reason": None},
            }
        ],
    }
    kept = json.loads(json.dumps(answer))
    withhold_unasked(kept, AskedFields(token_ids=True, logprobs=True))
    assert kept == answer
    withhold_unasked(kept, AskedFields(token_ids=False, logprobs=True))
    assert kept == {
        "choices": [
            {
                "text": "a",
                "logprobs": {"token_logprobs": [-0.1]},
                "provider_specific_fields": {"token_ids": None, "stop_reason": None},
            }
        ]
    }
    withhold_unasked(kept, AskedFields(token_ids=False, logprobs=False))
    assert kept["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("logprobs", "named"),
    [
        ([{"logprob": -0.5, "top_logprobs": [{"logprob": float("nan")}]}], "top_logprobs"),
        ([{"logprob": -1e300, "top_logprobs": []}], "response_logprobs[0]"),
        ([{"logprob": float("-inf"), "top_logprobs": []}], "response_logprobs[0]"),
    ],
    ids=["NaN alternative", "beyond float32", "minus infinity"],
)
def test_a_logprob_the_answer_cannot_carry_makes_it_unusable(logprobs: list, named: str) -> None:
    """The agent's JSON answer cannot carry a non-finite number, nor a float32 column store one
    beyond its range: such an answer is refused with the field named, not stored as -inf."""
    response = {
        "model": "m",
        "prompt_token_ids": [1],
        "choices": [
            {"message": {"content": "a"}, "token_ids": [3], "logprobs": {"content": logprobs}}
        ],
    }
    pending = pending_call("c", {"model": "m"}, TurnIdentity(), None, False, Redactor())
    with pytest.raises(UnusableAnswer, match=re.escape(named)):
        turns_from_response(pending, response, Redactor(), "w")


@pytest.mark.parametrize("trajectory", ["t", None])
def test_each_choice_is_its_own_rollout_of_the_group(trajectory: str | None) -> None:
    """n > 1 samples a group in one call: choice i is trajectory ``<t>.<i>``, not a next step."""
    identity = TurnIdentity(trajectory_id=trajectory, group_id="g")
    complete = {
        "model": "m",
        "prompt_token_ids": [1, 2],
        "choices": [{"message": {"content": c}, "token_ids": [3]} for c in "abc"],
    }
    pending = pending_call("c", {"model": "m", "n": 3}, identity, None, False, Redactor())
    streamed = StreamAccumulator()
    for index in range(3):
        streamed.add({"model": "m", "choices": [{"index": index, "delta": {"content": "x"}}]})
    for turns in (
        turns_from_response(pending, complete, Redactor(), "w"),
        streamed.turns(pending, Redactor(), "w"),
    ):
        assert [t.turn_id for t in turns] == ["c", "c.1", "c.2"]
        expected = [trajectory, f"{trajectory}.1", f"{trajectory}.2"] if trajectory else [None] * 3
        assert [t.trajectory_id for t in turns] == expected
        assert {t.group_id for t in turns} == {"g"}


def test_lake_write_probe_leaves_nothing_and_fails_on_what_cannot_be_written(
    tmp_path: Path,
) -> None:
    fresh = tmp_path / "fresh" / "lake"
    Lake(str(fresh)).check_writable()
    assert fresh.is_dir() and not any(fresh.iterdir())
    Lake("memory:///lake").check_writable()
    in_the_way = tmp_path / "a-file-where-the-lake-should-go"
    in_the_way.write_text("")
    with pytest.raises(LakeStoreError, match="Not a directory"):
        Lake(str(in_the_way / "lake")).check_writable()
    with pytest.raises(LakeStoreError, match="Unknown scheme"):
        Lake("no-such-store://bucket/lake").check_writable()


def test_a_trajectory_whose_id_has_a_slash_can_be_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base-URL prefix accepts %2F-encoded ids, and choice 1 of an n > 1 call in
    "team/a/run" lands in "team/a/run.1": the lifecycle endpoint must accept what a call did."""
    settings = ClawSettings(lake_uri=str(tmp_path / "lake"), spool_dir=tmp_path / "spool")
    monkeypatch.setattr(CaptureRuntime, "_instance", CaptureRuntime(settings))
    client = TestClient(build_control_app())
    try:
        for trajectory_id in ("team/a/run", "team/a/run.1"):
            answer = client.post(
                f"/claw/v1/trajectories/{quote(trajectory_id, safe='')}/complete",
                json={"status": "aborted", "reward": 1},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["trajectory_id"] == trajectory_id
    finally:
        CaptureRuntime.shutdown_current()


def test_rendered_proxy_config_disables_router_cooldowns(tmp_path: Path) -> None:
    source = tmp_path / "custom.yaml"
    source.write_text("model_list: []\n")
    for config in (DEFAULT_CONFIG, source):
        rendered = render_config(config, tmp_path, port=1, backend="http://127.0.0.1:9/v1")
        assert yaml.safe_load(rendered.read_text())["router_settings"]["disable_cooldowns"]


@pytest.mark.parametrize("capture", [True, False])
def test_the_plain_proxy_runs_without_the_capture_callback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: bool
) -> None:
    """``--no-capture`` is the baseline of bench/capture_overhead.py: it must not capture."""
    import uvicorn

    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: ran.update(app=app))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # run_proxy sets the proxy's variables
    monkeypatch.setenv("CLAW_LAKE_URI", str(tmp_path / "lake"))
    monkeypatch.chdir(tmp_path)
    run_proxy("127.0.0.1", free_port(), None, None, 1, capture=capture)
    config = yaml.safe_load(Path(os.environ["CONFIG_FILE_PATH"]).read_text())
    assert ("callbacks" in config["litellm_settings"]) is capture
    assert ran["app"] == (
        "claw_pipelines.edge.asgi:app"
        if capture
        else "claw_pipelines.edge.frozen_heap:plain_litellm"
    )


def test_backend_model_names_the_default_model_without_asking_the_backend(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    rendered = render_config(DEFAULT_CONFIG, tmp_path, port=1, backend=dead, model="qwen3-8b")
    policy, twin = yaml.safe_load(rendered.read_text())["model_list"]
    assert policy["litellm_params"]["api_base"] == twin["litellm_params"]["api_base"] == dead
    assert policy["litellm_params"]["model"] == "hosted_vllm/qwen3-8b"
    assert twin["litellm_params"]["model"] == "text-completion-openai/qwen3-8b"


def test_a_backend_that_does_not_answer_is_not_given_a_made_up_model(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ProxyStartError, match=f"backend {dead}/models did not answer"):
        served_model(dead)


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        (b'{"m": [{"c": 1e999}]}', "m[0].c", "not a finite number"),
        (b'{"a": {"b": -Infinity}}', "a.b", "not a finite number"),
        (b'{"a": 1' + b"0" * 400 + b".5}", "a", "not a finite number"),
        (b'{"ids": [1, 2, 3, [' + b"[" * 70 + b"]" * 71 + b"]}", "ids[3]", "nested deeper"),
        (b'{"\\udfff": 1}', "\\udfff", "lone UTF-16 surrogate"),
    ],
)
def test_request_bodies_are_refused_naming_the_field(body: bytes, field: str, problem: str) -> None:
    with pytest.raises(BodyRejected) as refused:
        parse_json_object(body)
    assert refused.value.status == 400
    assert refused.value.message.startswith(field) and problem in refused.value.message


def test_request_bodies_that_only_look_suspect_are_accepted() -> None:
    """Brackets and escapes inside strings, a surrogate pair, big and tiny floats, long lists."""
    body = {
        "text": "[[[[" * 40 + "\\ud800 is written as text",
        "pair": "\U0001f600",
        "floats": [1.7e308, 5e-324, -0.0],
        "ids": list(range(100_000)),
    }
    assert parse_json_object(json.dumps(body).encode()) == body


@pytest.mark.parametrize(
    "body",
    [
        {"seed": 2**64 + 1, "ids": [-(2**70), 12345678901234567890123]},
        {"x": 1.5e300, "y": [0.1, -0.0, 3], "text": "é \u2028 \U0001f600", "n": None},
        {"deep": [[[[[[[[[[{"a": [1]}]]]]]]]]]] * 8},
    ],
)
def test_request_bodies_parse_to_what_json_reads(body: dict) -> None:
    """orjson reads the body where it reads what ``json`` does; integers past 64 bits, which it
    would read as floats, are read by ``json``."""
    raw = json.dumps(body).encode()
    parsed = parse_json_object(raw)
    assert parsed == json.loads(raw)
    assert json.dumps(parsed) == raw.decode(), "the same types: an int stays an int"


def test_texts_are_written_as_json_writes_what_orjson_cannot() -> None:
    """Integers past 64 bits, non-string keys and lone surrogates fall back to ``json``;
    datetimes and anything else without a JSON type are ``str()`` as with ``default=str``."""
    odd = {"big": 2**70, 1: "int key", "lone": "\ud800", "at": datetime(2026, 1, 2, 3, 4, 5)}
    assert json_text.dumps(odd) == json.dumps(odd, ensure_ascii=False, default=str)
    plain = {"at": datetime(2026, 1, 2, 3, 4, 5), "set": {1}, "text": "é", "n": [1, 2.5, None]}
    assert json.loads(json_text.dumps(plain)) == json.loads(json.dumps(plain, default=str))


def test_both_proxies_freeze_the_heap_once_startup_completes_and_not_before() -> None:
    """Full collections would otherwise walk everything start-up left, on every one of them;
    the capture edge and ``--no-capture`` alike, so the benchmark's baseline has it too."""
    seen: list[int] = []

    async def lifespan_app(scope, receive, send) -> None:
        await receive()
        seen.append(gc.get_freeze_count())
        await send({"type": "lifespan.startup.complete"})

    async def receive() -> dict[str, str]:
        return {"type": "lifespan.startup"}

    async def send(message: dict[str, str]) -> None:
        seen.append(gc.get_freeze_count())

    for app in (CaptureApp(lifespan_app, max_body_bytes=1024), PlainProxy(lifespan_app)):
        seen.clear()
        gc.unfreeze()
        try:
            asyncio.run(app({"type": "lifespan"}, receive, send))
            assert seen[0] == 0  # nothing frozen while start-up runs
            assert seen[1] > 0  # frozen before start-up is reported done
        finally:
            gc.unfreeze()
