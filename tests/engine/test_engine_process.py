"""The engine as ``claw sim`` runs it, through the real LiteLLM ``hosted_vllm/`` client path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import litellm

from claw_pipelines.demo import CALCULATOR_TOOL
from claw_pipelines.processes import Service

QUESTION = [{"role": "user", "content": "What is 37 + 45?"}]


def _log_lines(service: Service) -> list[dict]:
    path = service.log_path.parent / "answers.jsonl"
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_litellm_non_streaming_keeps_token_ids(sim: Service) -> None:
    response = asyncio.run(
        litellm.acompletion(
            model="hosted_vllm/sim",
            api_base=f"{sim.url}/v1",
            api_key="none",
            messages=QUESTION,
            tools=[CALCULATOR_TOOL],
            logprobs=True,
            top_logprobs=2,
            extra_body={"return_token_ids": True},
        )
    )
    choice = response.choices[0]
    token_ids = choice.provider_specific_fields["token_ids"]
    assert response.prompt_token_ids
    assert token_ids
    assert len(choice.logprobs.content) == len(token_ids)
    logged = next(line for line in _log_lines(sim) if line["id"] == response.id)
    assert logged["prompt_token_ids"] == response.prompt_token_ids
    assert logged["token_ids"] == token_ids
    assert logged["logprobs"] == [entry.logprob for entry in choice.logprobs.content]
    assert logged["finish_reason"] == choice.finish_reason
    assert logged["stream"] is False


def test_litellm_streaming_keeps_per_chunk_token_ids(sim: Service) -> None:
    async def collect() -> tuple[list[int], str, str | None]:
        stream = await litellm.acompletion(
            model="hosted_vllm/sim",
            api_base=f"{sim.url}/v1",
            api_key="none",
            messages=[{"role": "user", "content": "What is 6 * 7?"}],
            logprobs=True,
            seed=11,
            stream=True,
            extra_body={"return_token_ids": True},
        )
        ids: list[int] = []
        text, finish = "", None
        async for chunk in stream:
            for choice in chunk.choices:
                ids += getattr(choice, "token_ids", None) or []
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return ids, text, finish

    ids, text, finish = asyncio.run(collect())
    logged = _log_lines(sim)[-1]
    assert logged["stream"] is True
    assert finish == logged["finish_reason"]
    # LiteLLM 1.108.7 drops the last chunk's token_ids (the end-of-turn token) from the stream.
    assert ids == logged["token_ids"][: len(ids)]
    assert len(ids) >= len(logged["token_ids"]) - 1
    assert text


def test_process_answers_400_on_malformed_json(sim: Service) -> None:
    response = httpx.post(
        f"{sim.url}/v1/chat/completions",
        content=b"{",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == 400


def test_process_reads_its_window_from_the_environment(sim: Service, sim_window: int) -> None:
    (card,) = httpx.get(f"{sim.url}/v1/models").json()["data"]
    assert card["max_model_len"] == sim_window
