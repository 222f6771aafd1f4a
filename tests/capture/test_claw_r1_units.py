"""Claw-R1 compatibility without a proxy process: what ``--compat claw-r1`` adds to the config,
the answer's shape, and who the edge lets call Claw-R1's routes without the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from claw_pipelines.edge.asgi import CaptureApp
from claw_pipelines.edge.claw_r1.answers import chat_answer
from claw_pipelines.edge.claw_r1.config import HERMES_LAYOUT, with_claw_r1
from claw_pipelines.edge.claw_r1.served import ClawR1Config
from claw_pipelines.edge.launcher import DEFAULT_CONFIG, render_config

MASTER_KEY = "sk-test-claw-r1-units-0123456789"
TOOL_CALL = {
    "id": "call-1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "17 + 25"}'},
}


def _rendered(tmp_path: Path, source: Path = DEFAULT_CONFIG, compat: str | None = "claw-r1"):
    path = render_config(source, tmp_path, port=1, compat=compat)
    return path, yaml.safe_load(path.read_text())


def test_the_switch_adds_hidden_aliases_and_the_token_prompt_twin(tmp_path: Path) -> None:
    _, off = _rendered(tmp_path, compat=None)
    assert "model_group_alias" not in off["router_settings"]
    twins = ["policy", "policy-token-prompts"]  # every hosted_vllm model has its twin
    assert [entry["model_name"] for entry in off["model_list"]] == twins

    path, on = _rendered(tmp_path)
    assert on["claw_compat"]["claw_r1"]["enabled"] is True
    assert on["router_settings"]["model_group_alias"] == {
        "default": {"model": "policy", "hidden": True}
    }
    policy, twin = on["model_list"]
    assert twin["model_name"] == "policy-token-prompts"
    assert twin["litellm_params"]["model"] == "text-completion-openai/claw-sim"
    assert twin["litellm_params"]["api_base"] == policy["litellm_params"]["api_base"]

    served = ClawR1Config.load(str(path))
    assert served is not None and served.generate_model == "policy-token-prompts"
    sim_layout = "<tool_call>{call}</tool_call>"  # resources/litellm.yaml, for claw-sim
    assert served.layout_for("default") == served.layout_for("policy") == sim_layout
    assert served.layout_for("another-model") == HERMES_LAYOUT
    assert ClawR1Config.load(str(_rendered(tmp_path, compat=None)[0])) is None


def test_enabling_the_block_in_the_config_is_the_same_as_the_switch(tmp_path: Path) -> None:
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["claw_compat"]["claw_r1"]["enabled"] = True
    source = tmp_path / "enabled.yaml"
    source.write_text(yaml.safe_dump(config))
    path, rendered = _rendered(tmp_path / "block", source, compat=None)
    assert rendered == _rendered(tmp_path / "switch", compat="claw-r1")[1]
    assert ClawR1Config.load(str(path)) is not None


def test_the_block_is_configurable_and_checked(tmp_path: Path) -> None:
    """Aliases are a list; a model already named so is left alone; a default model that is not
    served, or a layout without the call, stops the start."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["model_list"].append({"model_name": "gpt-4o", "litellm_params": {"model": "openai/x"}})
    config["claw_compat"]["claw_r1"]["model_aliases"] = ["default", "gpt-4o", "qwen"]
    aliases = with_claw_r1(config, enable=True)["router_settings"]["model_group_alias"]
    assert sorted(aliases) == ["default", "qwen"]

    config["claw_compat"]["claw_r1"]["default_model"] = "missing"
    with pytest.raises(ValueError, match="default_model 'missing' is not in model_list"):
        with_claw_r1(config, enable=True)
    config["claw_compat"]["claw_r1"] |= {"default_model": "policy", "tool_call_layouts": {"m": "x"}}
    with pytest.raises(ValueError, match=re.escape("tool call layouts without {call}: m")):
        with_claw_r1(config, enable=True)


def test_a_non_vllm_default_model_gets_no_twin(tmp_path: Path) -> None:
    source = tmp_path / "openai.yaml"
    models = [{"model_name": "policy", "litellm_params": {"model": "openai/gpt-4o-mini"}}]
    source.write_text(yaml.safe_dump({"model_list": models}))
    path, config = _rendered(tmp_path, source)
    assert [entry["model_name"] for entry in config["model_list"]] == ["policy"]
    served = ClawR1Config.load(str(path))
    assert served is not None and served.generate_model is None


def test_tool_calls_are_written_into_content_as_the_model_wrote_them() -> None:
    message = {"role": "assistant", "content": "Let me compute.", "tool_calls": [TOOL_CALL]}
    completion = {"id": "c", "choices": [{"finish_reason": "tool_calls", "message": message}]}
    (choice,) = chat_answer(completion, HERMES_LAYOUT)["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {
        "role": "assistant",
        "content": 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": '
        '{"expression": "17 + 25"}}\n</tool_call>',
    }
    plain = {"choices": [{"finish_reason": "stop", "message": {"content": "42"}}]}
    assert chat_answer(plain, HERMES_LAYOUT) == plain


class _Inner:
    """Stands in for LiteLLM behind the edge (the policy gate before it needs the capture
    runtime): records the path and headers of what reached it, answers a chat completion."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[bytes, bytes]]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.seen.append((scope["path"], dict(scope["headers"])))
        body = {"choices": [{"finish_reason": "stop", "message": {"content": "4"}}]}
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _edge(tmp_path: Path, bind_host: str, keyless: bool = True) -> tuple[TestClient, _Inner]:
    rendered = render_config(DEFAULT_CONFIG, tmp_path, 1, compat="claw-r1")
    config = yaml.safe_load(rendered.read_text())
    config["claw_compat"]["claw_r1"]["keyless_on_loopback"] = keyless
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(config))
    inner = _Inner()
    app = CaptureApp(inner, 1 << 20, ClawR1Config.load(str(path)), bind_host)
    app.claw_r1.inner = inner
    return TestClient(app), inner


@pytest.mark.parametrize(
    ("bind_host", "keyless", "served_without_key"),
    [
        ("127.0.0.1", True, True),
        ("localhost", True, True),
        ("::1", True, True),
        ("0.0.0.0", True, False),
        ("192.0.2.2", True, False),
        ("127.0.0.1", False, False),
    ],
)
def test_keyless_calls_need_the_switch_and_a_loopback_bind(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bind_host: str,
    keyless: bool,
    served_without_key: bool,
) -> None:
    monkeypatch.setenv("LITELLM_MASTER_KEY", MASTER_KEY)
    client, inner = _edge(tmp_path, bind_host, keyless)
    chat = {"messages": [{"role": "user", "content": "2 + 2?"}]}
    for key in (None, "not-needed"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        answer = client.post("/init_trajectory", headers=headers)
        assert answer.status_code == (200 if served_without_key else 401), answer.text
        called = client.post("/t1/p1/v1/chat/completions", json=chat, headers=headers)
        assert called.status_code == (200 if served_without_key else 401), called.text
    keyed = client.post("/init_trajectory", headers={"Authorization": f"Bearer {MASTER_KEY}"})
    assert keyed.status_code == 200
    trajectory, prompt, version = keyed.json()["base_url"].rsplit("/", 3)[1:]
    assert (trajectory, version) == (keyed.json()["trajectory_uid"], "v1") and prompt
    # our own routes need the key whatever the bind
    assert client.post("/v1/chat/completions", json=chat).status_code == 401
    assert client.post("/claw/v1/steps", json={}).status_code == 401
    calls = 2 if served_without_key else 0
    assert [path for path, _ in inner.seen] == ["/v1/chat/completions"] * calls


def test_litellm_is_handed_the_master_key_not_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_MASTER_KEY", MASTER_KEY)
    client, inner = _edge(tmp_path, "127.0.0.1")
    answer = client.post(
        "/t1/p1/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "2 + 2?"}]},
        headers={"Authorization": "Bearer not-needed"},
    )
    assert answer.json()["choices"][0]["message"]["content"] == "4"
    ((_, headers),) = inner.seen
    assert headers[b"authorization"] == f"Bearer {MASTER_KEY}".encode()
    assert (headers[b"x-claw-trajectory"], headers[b"x-claw-group"]) == (b"t1", b"p1")
