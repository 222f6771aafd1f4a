"""A vLLM-shaped backend whose answer a test picks in the last user message, for what the
embedded engine cannot be made to answer (a 3 MiB answer, an error that echoes the caller's key).

``big <n>``: an answer of ``n`` characters with token IDs and logprobs, as vLLM sends with
``return_token_ids``; ``echo error``: a 400 whose message repeats the API key the request came
with and the user's message, as careless servers do; anything else: a short answer.

Run as ``python fake_backend.py <port>``; it serves ``/v1/models`` and ``/v1/chat/completions``.
"""

from __future__ import annotations

import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

MODEL = "fake-model"
ANSWER_TOKENS = 8

app = FastAPI()


@app.get("/v1/models")
def models() -> dict:
    return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}


@app.post("/v1/chat/completions")
async def chat(request: Request) -> JSONResponse:
    body = await request.json()
    asked = str(body["messages"][-1].get("content", ""))
    if asked.startswith("echo error"):
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        message = f"cannot serve {asked!r} for credentials {key!r}"
        error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
        return JSONResponse({"error": error}, status_code=400)
    content = "a" * int(asked.split()[1]) if asked.startswith("big ") else "ok"
    token_ids = list(range(100, 100 + ANSWER_TOKENS))
    logprobs = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}] * ANSWER_TOKENS
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": {"content": logprobs},
        "finish_reason": "stop",
        "token_ids": token_ids,
    }
    return JSONResponse(
        {
            "id": f"chatcmpl-fake-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": ANSWER_TOKENS, "total_tokens": 11},
            "prompt_token_ids": [1, 2, 3],
        }
    )


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
