"""The context window: configurable, reported as vLLM does, checked in vLLM 0.33's words."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from claw_pipelines.engine.context import DEFAULT_MAX_MODEL_LEN
from claw_pipelines.engine.server import create_app
from claw_pipelines.engine.tokenizer import MAX_CHARS_PER_TOKEN, encode, encode_turns
from claw_pipelines.processes import free_port, start_service

QUESTION = [{"role": "user", "content": "What is 37 + 45?"}]
WINDOW = 200


@pytest.fixture(scope="module")
def small() -> TestClient:
    with TestClient(create_app(seed=1, max_model_len=WINDOW)) as test_client:
        yield test_client


def prompt_len(client: TestClient, messages: list[dict]) -> int:
    return client.post("/tokenize", json={"messages": messages}).json()["count"]


def error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    body = response.json()["error"]
    assert (body["type"], body["code"]) == ("BadRequestError", 400)
    return body


def test_default_window_fits_an_agent_cli_prompt(client: TestClient) -> None:
    """Claude Code: a ~200k-character prompt with ``max_tokens: 32000`` is served, not refused."""
    assert DEFAULT_MAX_MODEL_LEN >= 131_072
    (card,) = client.get("/v1/models").json()["data"]
    assert card["max_model_len"] == DEFAULT_MAX_MODEL_LEN
    line = "Use the Read tool before editing a file; never guess at its contents. 17 tests pass.\n"
    system = line * (200_000 // len(line))
    messages = [{"role": "system", "content": system}, *QUESTION]
    response = client.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 32_000, "return_token_ids": True},
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 50_000


def test_window_is_configurable_and_reported(small: TestClient) -> None:
    (card,) = small.get("/v1/models").json()["data"]
    assert card["max_model_len"] == WINDOW
    assert small.post("/tokenize", json={"prompt": "hi"}).json()["max_model_len"] == WINDOW


def test_max_tokens_beyond_the_room_left_is_clamped(small: TestClient) -> None:
    """vLLM serves ``max_tokens`` up to the window and generates at most what the prompt leaves."""
    room = WINDOW - prompt_len(small, QUESTION)
    for seed in range(20):
        body = {"messages": QUESTION, "max_tokens": WINDOW, "seed": seed, "return_token_ids": True}
        response = small.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert len(choice["token_ids"]) <= room
    text = small.post("/v1/completions", json={"prompt": [1] * (WINDOW - 3), "max_tokens": 50})
    assert text.status_code == 200, text.text
    assert text.json()["choices"][0]["finish_reason"] == "length"
    assert text.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/chat/completions", "max_tokens"),
        ("/v1/chat/completions", "max_completion_tokens"),
        ("/v1/completions", "max_tokens"),
    ],
)
def test_max_tokens_beyond_the_window_is_refused_in_vllms_words(
    small: TestClient, path: str, field: str
) -> None:
    prompt = {"messages": QUESTION} if path.startswith("/v1/chat") else {"prompt": "What is 1 + 1?"}
    body = error(small.post(path, json={**prompt, field: WINDOW + 1}))
    assert body["message"] == (
        f"{field}={WINDOW + 1} cannot be greater than max_model_len={WINDOW}. "
        f"Please request fewer output tokens. (parameter={field}, value={WINDOW + 1})"
    )
    assert body["param"] == field


def test_prompt_beyond_the_window_is_refused_in_vllms_words(small: TestClient) -> None:
    long_text = [{"role": "user", "content": "What is 2 + 2? " * 100}]
    body = error(small.post("/v1/chat/completions", json={"messages": long_text}))
    assert body["message"] == (
        f"This model's maximum context length is {WINDOW} tokens. However, your prompt contains "
        f"at least {WINDOW + 1} input tokens, which exceeds this limit even without any output "
        f"tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={WINDOW + 1})"
    )
    assert body["param"] == "input_tokens"
    ids = error(small.post("/v1/completions", json={"prompt": [5] * (WINDOW + 7)}))
    assert "your prompt contains 207 input tokens, which exceeds" in ids["message"]


def test_prompt_filling_the_window_leaves_no_room(small: TestClient) -> None:
    body = error(small.post("/v1/completions", json={"prompt": [5] * WINDOW}))
    assert body["message"] == (
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )
    zero = error(small.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 0}))
    assert zero["message"].startswith("max_tokens must be at least 1, got 0.")


def test_prompt_text_beyond_any_tokenization_is_refused_untokenized(small: TestClient) -> None:
    limit = WINDOW * MAX_CHARS_PER_TOKEN
    body = error(small.post("/v1/completions", json={"prompt": "a" * (limit + 1)}))
    assert body["message"] == (
        f"This model's maximum context length is {WINDOW} tokens. However, your prompt contains "
        f"{limit + 1} characters (more than {limit} characters, which is the upper bound for "
        f"{WINDOW} input tokens). Please reduce the length of the input prompt. "
        f"(parameter=input_text, value={limit + 1})"
    )


def test_turns_tokenize_one_by_one_as_their_concatenation() -> None:
    turns = [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n",
        "<|im_start|>user\nWhat is 17 + 25?  \n\n(ok)<|im_end|>\n",
        "trailing   spaces and unicode ünï 🎉\n",
        "<|im_start|>assistant\n",
    ]
    assert encode_turns(turns) == encode("".join(turns))
    assert encode_turns(turns[1:]) == encode("".join(turns[1:]))


def test_claw_sim_takes_the_window_as_a_flag(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "claw_pipelines.cli", "sim", "--port", str(port)]
    service = start_service(
        "engine-window",
        [*command, "--max-model-len", "1000"],
        f"http://127.0.0.1:{port}",
        tmp_path / "engine.log",
    )
    try:
        service.wait_ready("/health", timeout_s=60)
        (card,) = httpx.get(f"{service.url}/v1/models").json()["data"]
        assert card["max_model_len"] == 1000
        refused = httpx.post(
            f"{service.url}/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 1001}
        )
        assert "cannot be greater than max_model_len=1000" in error(refused)["message"]
    finally:
        service.stop()
