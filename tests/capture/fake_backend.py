"""A vLLM-shaped backend whose answer a test picks in the last user message, for what the
embedded engine cannot be made to answer (a 3 MiB answer, an error that echoes the caller's key,
answers no row can be made of).

``big <n>``: an answer of ``n`` characters with token IDs and logprobs, as vLLM sends with
``return_token_ids``; ``echo error``: a 400 whose message repeats the API key the request came
with and the user's message, as careless servers do; ``no choices``: an answer with
``choices: []``; ``token id <json>``: that value among the answer's token IDs; ``nan logprob``: a
``NaN`` logprob; ``no message``: a choice without its ``message``, among whose token IDs is a
``429``; anything else: a short answer. A request with ``stream: true`` gets the same
answer as vLLM's event stream.

Run as ``python fake_backend.py <port>``; it serves ``/v1/models`` and ``/v1/chat/completions``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODEL = "fake-model"
ANSWER_TOKENS = 8

app = FastAPI()


@app.get("/v1/models")
def models() -> dict:
    return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}


def _asked(body: dict[str, Any]) -> str:
    """The last message's text, whether its content is a string or a list of text parts."""
    content = body["messages"][-1].get("content") or ""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content)
    return str(content)


def _choice(asked: str) -> dict[str, Any]:
    content = "a" * int(asked.split()[1]) if asked.startswith("big ") else "ok"
    token_ids: list[Any] = list(range(100, 100 + ANSWER_TOKENS))
    if asked.startswith("token id "):
        token_ids[-1] = json.loads(asked.removeprefix("token id "))
    entries = [
        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}
        for _ in range(ANSWER_TOKENS)
    ]
    if asked == "nan logprob":
        entries[-1]["logprob"] = float("nan")
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": {"content": entries},
        "finish_reason": "stop",
        "token_ids": token_ids,
    }
    if asked == "no message":
        del choice["message"]
        token_ids[0] = 429
    return choice


def _answer(asked: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [] if asked == "no choices" else [_choice(asked)],
        "usage": {"prompt_tokens": 3, "completion_tokens": ANSWER_TOKENS, "total_tokens": 11},
        "prompt_token_ids": [1, 2, 3],
    }


def _events(answer: dict[str, Any]) -> list[bytes]:
    """The answer as vLLM streams it: one chunk with the text, one with the finish reason."""
    base = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [{**base, "choices": [], "prompt_token_ids": answer["prompt_token_ids"]}]
    for choice in answer["choices"]:
        delta = {
            "index": 0,
            "delta": {"role": "assistant", "content": choice.get("message", {}).get("content")},
        }
        chunks.append(
            {
                **base,
                "choices": [
                    {**delta, "logprobs": choice["logprobs"], "token_ids": choice["token_ids"]}
                ],
            }
        )
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    frames = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks]
    return [*frames, b"data: [DONE]\n\n"]


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    body = await request.json()
    asked = _asked(body)
    if asked.startswith("echo error"):
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        message = f"cannot serve {asked!r} for credentials {key!r}"
        error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
        return JSONResponse({"error": error}, status_code=400)
    answer = _answer(asked)
    if body.get("stream"):
        return StreamingResponse(iter(_events(answer)), media_type="text/event-stream")
    # json.dumps writes a NaN as the literal NaN, as a careless server would (JSONResponse refuses)
    return Response(json.dumps(answer), media_type="application/json")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
