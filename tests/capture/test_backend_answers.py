"""Backend answers no row can be made of, through the real proxy on every route: the agent gets
a 502 naming the problem (no validation dump) and exactly one error row lands, instead of a 200
whose row never lands (``choices: []``), a 500 with no row (token IDs that are not int32
vocabulary indices) or a 500 after a success row landed (a ``NaN`` logprob).

The fake backend (``fake_backend.py``) answers what the last user message asks for."""

from __future__ import annotations

import json

import httpx
import pytest
from fake_backend_stack import FakeBackendStack
from test_capture_proxy import landed, post

CASES = {
    "no choices": "no choices",
    "token id over int32": "token id 2147483648",
    "token id below zero": "token id -1",
    "token id not a number": 'token id "x"',
    "token id a boolean": "token id true",
    "NaN logprob": "nan logprob",
}
NAMED = {
    "no choices": "no choices",
    "token id over int32": "response_token_ids[7]",
    "token id below zero": "response_token_ids[7]",
    "token id not a number": "response_token_ids[7]",
    "token id a boolean": "response_token_ids[7]",
    "NaN logprob": "response_logprobs[7]",
}
INTERNALS = ("validation error", "pydantic", "input_value", "Traceback", "OverflowError")


def _body(route: str, model: str, asked: str, stream: bool) -> tuple[str, dict]:
    if route == "chat":
        messages = [{"role": "user", "content": asked}]
        return "/v1/chat/completions", {"model": model, "messages": messages, "stream": stream}
    if route == "responses":
        return "/v1/responses", {"model": model, "input": asked, "stream": stream}
    messages = [{"role": "user", "content": asked}]
    body = {"model": model, "max_tokens": 16, "messages": messages, "stream": stream}
    return "/v1/messages", body


def _error_row(stack: FakeBackendStack, turn_id: str, route: str) -> dict:
    rows = landed(stack, [turn_id])
    assert rows.height == 1, rows.select("status", "error").to_dicts()
    row = rows.row(0, named=True)
    assert (row["status"], row["api"], row["token_source"]) == ("error", route, "none")
    assert row["response_token_ids"] is None and row["response_logprobs"] is None
    return row


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
@pytest.mark.parametrize("case", list(CASES))
def test_an_answer_no_row_can_be_made_of_is_a_502_and_an_error_row(
    fake_backend_stack: FakeBackendStack, case: str, route: str, stream: bool
) -> None:
    """Streams of the default model are buffered: the whole answer is checked before any of
    it is sent, so a stream fails with the same 502 as a whole answer."""
    path, body = _body(route, "policy", CASES[case], stream)
    response = post(fake_backend_stack, path, json.dumps(body).encode())
    assert response.status_code == 502, response.text[:500]
    message = response.json()["error"]["message"]
    assert NAMED[case] in message, message
    assert not [text for text in INTERNALS if text in response.text], response.text
    row = _error_row(fake_backend_stack, response.headers["x-litellm-call-id"], route)
    assert message in row["error"]


def _events(response: httpx.Response) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines()]
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.parametrize("case", ["token id over int32", "token id not a number", "NaN logprob"])
def test_a_passthrough_stream_ends_with_the_error_and_lands_its_row(
    fake_backend_stack: FakeBackendStack, case: str
) -> None:
    """A passthrough stream has sent its 200 and its first chunks by the time the answer is
    whole: the final chunk is held back, and the stream ends with an error event instead."""
    path, body = _body("chat", "policy-live", CASES[case], stream=True)
    response = post(fake_backend_stack, path, json.dumps(body).encode())
    assert response.status_code == 200, response.text[:500]
    events = _events(response)
    assert "error" in events[-1], json.dumps(events)[:2000]
    message = events[-1]["error"]["message"]
    assert NAMED[case] in message, message
    assert not any(choice.get("finish_reason") for e in events for choice in e.get("choices", []))
    assert not [text for text in INTERNALS if text in response.text], response.text
    row = _error_row(fake_backend_stack, response.headers["x-litellm-call-id"], "chat")
    assert message in row["error"]


@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
def test_an_answer_without_a_message_is_never_a_429(
    fake_backend_stack: FakeBackendStack, route: str
) -> None:
    """LiteLLM guesses a rate limit from a ``429`` anywhere in an error's text, here a token ID
    of the answer it could not read: an agent retrying on 429 would retry a failure that
    repeats."""
    path, body = _body(route, "policy", "no message", stream=False)
    response = post(fake_backend_stack, path, json.dumps(body).encode())
    assert response.status_code == 502, response.text[:500]
    assert not [text for text in INTERNALS if text in response.text], response.text
    row = _error_row(fake_backend_stack, response.headers["x-litellm-call-id"], route)
    assert response.json()["error"]["message"] in row["error"]


@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
def test_a_usable_answer_still_lands_one_success_row(
    fake_backend_stack: FakeBackendStack, route: str
) -> None:
    path, body = _body(route, "policy", "hello", stream=False)
    response = post(fake_backend_stack, path, json.dumps(body).encode())
    assert response.status_code == 200, response.text[:500]
    rows = landed(fake_backend_stack, [response.headers["x-litellm-call-id"]])
    assert rows.height == 1
    row = rows.row(0, named=True)
    assert (row["status"], row["api"], row["token_source"]) == ("success", route, "engine")
    assert row["response_token_ids"] == list(range(100, 108))


def test_a_passthrough_stream_without_choices_lands_the_empty_answer_it_got(
    fake_backend_stack: FakeBackendStack,
) -> None:
    """LiteLLM ends a stream that carried no choices with a stop chunk of its own, so the agent
    gets an empty answer; its one row says so (no text, no token IDs to train on)."""
    path, body = _body("chat", "policy-live", CASES["no choices"], stream=True)
    response = post(fake_backend_stack, path, json.dumps(body).encode())
    assert response.status_code == 200, response.text[:500]
    (event,) = _events(response)
    assert event["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    rows = landed(fake_backend_stack, [response.headers["x-litellm-call-id"]])
    assert rows.height == 1
    row = rows.row(0, named=True)
    assert (row["status"], row["finish_reason"], row["token_source"]) == ("success", "stop", "none")
    assert row["response_text"] is None and row["response_token_ids"] is None
