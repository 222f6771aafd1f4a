"""What a real agent CLI sent and was answered, seen from outside the capture proxy.

``Relay`` sits between the CLI and the proxy and forwards every request byte for byte, recording
each answer's status and ``x-litellm-call-id``: the calls the proxy answered, counted by
something other than the capture code under test. ``OutboundGuard`` is the CLIs' HTTP(S) proxy
(``HTTPS_PROXY``, with loopback exempt): any attempt to reach the internet lands there as a
``CONNECT host:443`` line and is refused, so a test can assert there was none.
"""

from __future__ import annotations

import asyncio
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import uvicorn

from claw_pipelines.processes import free_port

HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding"}
"""Per-connection headers: each side of the relay sets its own."""
SET_BY_CLIENT = HOP_BY_HOP | {b"host", b"content-length"}
"""Request headers httpx sets itself for the forwarded request."""
START_TIMEOUT_S = 30
REFUSAL = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass(frozen=True)
class Exchange:
    """One request the proxy answered."""

    method: str
    path: str
    status: int
    call_id: str | None


@dataclass
class Relay:
    """A loopback HTTP relay to ``target`` that records every exchange (use as a context).

    ``before_forward(n)`` runs (in a thread) before the ``n``-th request (from 0) is forwarded,
    while the agent waits for its answer: a test restarts the proxy there, mid-session."""

    target: str
    exchanges: list[Exchange] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    before_forward: Callable[[int], object] | None = None
    received: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __call__(self, scope: dict, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["raw_path"].decode()
        if scope["query_string"]:
            path += "?" + scope["query_string"].decode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in SET_BY_CLIENT]
        index, self.received = self.received, self.received + 1
        if self.before_forward is not None:
            await asyncio.to_thread(self.before_forward, index)
        async with httpx.AsyncClient(timeout=None) as client:
            request = client.build_request(
                scope["method"], self.target + path, headers=headers, content=body
            )
            upstream = await client.send(request, stream=True)
            call_id = upstream.headers.get("x-litellm-call-id")
            # Recorded before the client gets a byte, so no agent finishes before its record.
            self.exchanges.append(Exchange(scope["method"], path, upstream.status_code, call_id))
            answer_headers = [
                (k, v) for k, v in upstream.headers.raw if k.lower() not in HOP_BY_HOP
            ]
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status_code,
                    "headers": answer_headers,
                }
            )
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            await upstream.aclose()

    def __enter__(self) -> Relay:
        config = uvicorn.Config(
            self, host="127.0.0.1", port=self.port, lifespan="off", log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the relay to {self.target} did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class _RefuseAndRecord(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline(4096).decode("latin-1").strip()
        self.server.attempts.append(line)  # type: ignore[attr-defined]
        self.wfile.write(REFUSAL)


class OutboundGuard(socketserver.ThreadingTCPServer):
    """A forward proxy that refuses everything and keeps each request's first line."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RefuseAndRecord)
        self.attempts: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def proxy_env(self) -> dict[str, str]:
        """Proxy variables (both spellings, as tools read either) exempting loopback."""
        env = {"HTTPS_PROXY": self.url, "HTTP_PROXY": self.url, "ALL_PROXY": self.url}
        env["NO_PROXY"] = "127.0.0.1,localhost"
        return env | {name.lower(): value for name, value in env.items()}

    def __enter__(self) -> OutboundGuard:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
        self.server_close()
