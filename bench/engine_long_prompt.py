"""The embedded engine on an agent-sized prompt: render, tokenize and answer times.

Agent CLIs (Claude Code, Codex CLI, OpenClaw) send 100k-250k characters per call: a long system
prompt, a dozen tool schemas and the conversation so far. This builds such a request from this
repository's own prose and code (real text, not random letters), times the chat template and the
tokenizer on it (cold and warm token cache), then whole ``/v1/chat/completions`` calls in process:
the first call (nothing cached), then calls that each add one exchange to the conversation, as an
agent's loop does, non-streaming and streaming, against a call with a one-line prompt (the bare
baseline).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from itertools import count
from pathlib import Path

from fastapi.testclient import TestClient

from claw_pipelines.engine.chat_template import render
from claw_pipelines.engine.protocol import ChatCompletionRequest
from claw_pipelines.engine.server import create_app
from claw_pipelines.engine.tokenizer import _encode_pretoken, _encode_turn, encode

ROOT = Path(__file__).resolve().parents[1]


def corpus() -> str:
    files = [ROOT / "README.md", *sorted((ROOT / "claw_pipelines").rglob("*.py"))]
    return "\n".join(path.read_text() for path in files)


def agent_request(chars: int) -> dict:
    """A Claude-Code-shaped chat request of about ``chars`` characters."""
    text = corpus()
    system = text[: chars // 2]
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": text[i * 2000 : i * 2000 + 1500],
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "path": {"type": "string"}},
                    "required": ["command"],
                },
            },
        }
        for i in range(16)
    ]
    history = text[chars // 2 : chars - 16 * 1500]
    turns = [history[i : i + 4000] for i in range(0, len(history), 4000)]
    messages = [{"role": "system", "content": system}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": turn}
        for i, turn in enumerate(turns)
    ]
    messages.append({"role": "user", "content": "What is 17 + 25?"})
    return {"messages": messages, "tools": tools, "max_tokens": 32000, "return_token_ids": True}


def timed(call: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``call`` in ms."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


QUICK = {"chars": 60_000, "repeat": 1}
"""``--quick``: a short prompt once, for the suite (tests/bench)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chars", type=int, default=220_000, help="prompt size (~55k BPE tokens)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run: {QUICK}")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    body = agent_request(args.chars)
    request = ChatCompletionRequest.model_validate(body)
    text = render(request.messages, request.tools)
    short = {**body, "messages": body["messages"][-1:], "tools": body["tools"][:1]}
    turns = count()

    def next_turn() -> dict:
        """The same conversation one exchange further, as an agent's next call."""
        extra = [
            {"role": "assistant", "content": f"Step {next(turns)}: reading the file."},
            {"role": "user", "content": "What is 17 + 25?"},
        ]
        body["messages"] = body["messages"] + extra
        return body

    with TestClient(create_app(seed=0)) as client:

        def call(payload: dict, stream: bool = False) -> None:
            response = client.post("/v1/chat/completions", json={**payload, "stream": stream})
            response.raise_for_status()

        cold_caches()
        first = timed(lambda: call(body), 1)
        baseline = timed(lambda: call(short), args.repeat)
        later = timed(lambda: call(next_turn()), args.repeat)
        later_stream = timed(lambda: call(next_turn(), stream=True), args.repeat)
    cold_caches()
    result = {
        "prompt_chars": len(text),
        "prompt_tokens": len(encode(text)),
        "render_ms": timed(lambda: render(request.messages, request.tools), args.repeat),
        "encode_cold_ms": timed(lambda: (cold_caches(), encode(text)), 1),
        "encode_warm_ms": timed(lambda: encode(text), args.repeat),
        "baseline_request_ms": baseline,
        "first_request_ms": first,
        "next_turn_request_ms": later,
        "next_turn_stream_ms": later_stream,
        "next_turn_over_baseline": later / baseline,
    }
    print(json.dumps(result))


def cold_caches() -> None:
    _encode_pretoken.cache_clear()
    _encode_turn.cache_clear()


if __name__ == "__main__":
    main()
