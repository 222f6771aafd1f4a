"""Calls to the capture proxy the capture tests share: the official SDK client, raw posts, and
waiting for what they landed."""

from __future__ import annotations

import httpx
import openai
import polars as pl
import pytest
from stack_fixtures import CaptureStack

QUESTION = "What is 17 + 25?"


def client_for(stack: CaptureStack, base_path: str = "/v1", **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.proxy_url + base_path,
        api_key=stack.key,
        default_headers=headers or None,
        max_retries=0,
        timeout=60,
    )


def chat(client: openai.OpenAI, **kwargs: object) -> tuple[str, object]:
    """One non-streamed call; returns (turn id from x-litellm-call-id, parsed completion)."""
    messages = kwargs.pop("messages", [{"role": "user", "content": QUESTION}])
    raw = client.chat.completions.with_raw_response.create(
        model="policy", messages=messages, **kwargs
    )
    return raw.headers["x-litellm-call-id"], raw.parse()


def landed(stack: CaptureStack, turn_ids: list[str]) -> pl.DataFrame:
    turns = stack.wait_for_rows(lambda df: set(turn_ids) <= set(df["turn_id"]))
    return turns.filter(pl.col("turn_id").is_in(turn_ids))


def assert_matches_engine(stack: CaptureStack, row: dict, response_id: str) -> None:
    sent = stack.engine_answers()[response_id]
    assert row["token_source"] == "engine"
    assert row["prompt_token_ids"] == sent["prompt_token_ids"]
    assert row["response_token_ids"] == sent["token_ids"]
    assert row["response_logprobs"] == pytest.approx(sent["logprobs"], rel=1e-6)
    assert row["finish_reason"] == sent["finish_reason"]


def post(stack: CaptureStack, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        stack.proxy_url + path,
        content=content,
        headers={
            "authorization": f"Bearer {stack.key}",
            "content-type": "application/json",
            **headers,
        },
        timeout=60,
    )
