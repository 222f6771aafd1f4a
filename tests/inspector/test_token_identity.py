"""The inspector decodes token IDs with the tokenizer of the model that made them: the embedded
engine's own for its turns, the backend's ``/detokenize`` (as vLLM serves it) or the server the
operator names for any other model, and raw IDs when none is reachable."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from claw_pipelines.engine.server import MODEL_NAME
from claw_pipelines.engine.tokenizer import encode
from claw_pipelines.inspector import render
from claw_pipelines.inspector.detokenize import TOKENIZERS_ENV
from claw_pipelines.processes import free_port
from claw_pipelines.stack import start_engine


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory):
    """A real server with vLLM's ``/detokenize`` route (the embedded engine, another process)."""
    engine = start_engine(free_port(), Path(tmp_path_factory.mktemp("backend")))
    engine.wait_ready("/health", timeout_s=60)
    try:
        yield engine.url
    finally:
        engine.stop()


def _steps(model: str, backend: str | None) -> pl.DataFrame:
    ids = encode("the answer is 42")
    return pl.DataFrame(
        {"turn_id": ["t"], "model": [model], "backend": [backend],
         "response_token_ids": [ids], "response_logprobs": [[-0.1] * len(ids)]},
        schema_overrides={"response_token_ids": pl.List(pl.Int32)},
    )  # fmt: skip


def _text(steps: pl.DataFrame) -> str | None:
    decoded = render.tokens_by_step(steps, "response_token_ids", "response_logprobs").get("t")
    return "".join(decoded["texts"]) if decoded else None


def test_a_real_models_ids_are_decoded_by_its_backend(backend, monkeypatch):
    monkeypatch.delenv(TOKENIZERS_ENV, raising=False)
    served = f"hosted_vllm:{backend}/v1"
    assert _text(_steps("Qwen/Qwen3-8B", served)) == "the answer is 42"
    assert _text(_steps("Qwen/Qwen3-8B", None)) is None  # no tokenizer known: raw IDs
    assert _text(_steps("Qwen/Qwen3-8B", "hosted_vllm:http://127.0.0.1:9/v1")) is None
    monkeypatch.setenv(TOKENIZERS_ENV, f'{{"Qwen/Qwen3-8B": "{backend}"}}')
    assert _text(_steps("Qwen/Qwen3-8B", None)) == "the answer is 42"


def test_the_embedded_engines_turns_are_decoded_in_process(monkeypatch):
    monkeypatch.delenv(TOKENIZERS_ENV, raising=False)
    assert _text(_steps(MODEL_NAME, "hosted_vllm:http://127.0.0.1:9/v1")) == "the answer is 42"
