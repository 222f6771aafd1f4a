"""Freezing what LiteLLM's start-up left on the heap out of garbage collection.

Each full collection otherwise walks those ~800k long-lived objects again, about 0.8 ms of CPU
per call under load. It is the proxy process's tuning, not capture's: the capture edge
(``asgi.CaptureApp``) and the plain proxy of ``claw proxy --no-capture`` (``PlainProxy``, the
baseline of bench/capture_overhead.py) both freeze, so the benchmark measures capture alone.
"""

from __future__ import annotations

import gc
from typing import Any


def freezing_after_startup(send):
    """``send`` for the lifespan, which freezes the heap once start-up is complete: a collection
    first, so no start-up garbage is kept, then ``gc.freeze`` (what is frozen is never collected,
    and start-up's modules, config and router live as long as the process)."""

    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            gc.collect()
            gc.freeze()
        await send(message)

    return wrapped


class PlainProxy:
    """An ASGI app (LiteLLM's) as it is, with its start-up heap frozen."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] == "lifespan":
            send = freezing_after_startup(send)
        await self.inner(scope, receive, send)


def plain_litellm() -> PlainProxy:
    """LiteLLM's proxy app without the capture edge (``claw proxy --no-capture``)."""
    from litellm.proxy.proxy_server import app

    return PlainProxy(app)
