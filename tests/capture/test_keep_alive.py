"""An idle client connection outlives the clients' own pool expiry on the proxy's side.

uvicorn closes an idle connection after 5 s by default, the same 5 s after which httpx (and so
the openai and anthropic SDKs) stop reusing one: a request sent at that moment meets a closing
connection and gets a reset instead of an answer (a 16-minute soak lost its load generator to
one). The proxy keeps idle connections for ``CLAW_PROXY_KEEP_ALIVE_S`` (75 s by default)."""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

from stack_fixtures import CaptureStack

CLIENT_POOL_EXPIRY_S = 5.0
"""httpx's ``keepalive_expiry`` default, which the openai and anthropic SDKs keep."""


def test_an_idle_connection_is_still_open_after_the_clients_pool_expiry(
    capture_stack: CaptureStack,
) -> None:
    address = urlsplit(capture_stack.proxy_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("GET", "/health/liveliness")
        assert connection.getresponse().read() and connection.sock is not None
        opened = connection.sock
        time.sleep(CLIENT_POOL_EXPIRY_S + 1)
        connection.request("GET", "/health/liveliness")
        answer = connection.getresponse()  # RemoteDisconnected had the proxy closed it
        assert answer.status == 200 and answer.read()
        assert connection.sock is opened, "the request went out on a new connection"
    finally:
        connection.close()
