"""The inspector's key: with ``CLAW_INSPECTOR_KEY`` set, every page, API call and static file
needs it (``serve`` refuses to bind a non-loopback interface without a strong one).

A browser sends it as the password of HTTP Basic authentication (it asks once, then sends it
with every page and every ``fetch`` of the page's script); a script may send it as a bearer
token. Any user name is accepted: the key is what authenticates.

Because a browser sends remembered Basic credentials with any site's request, a write that
carries an ``Origin`` must come from the inspector's own (``SameOriginWrites``), with or without
a key; a client that sends no ``Origin`` (curl, a script) is judged by its key alone.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from urllib.parse import urlsplit

REALM = b'Basic realm="claw inspector", charset="UTF-8"'
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def presented_key(authorization: str) -> str | None:
    """The key in an ``Authorization`` header value: a bearer token or a Basic password."""
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip()
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[2]


async def _refuse(send, status: int, detail: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def is_same_origin(origin: str, host: str) -> bool:
    """Whether an ``Origin`` header names the server its request reached (by ``Host``; the
    scheme is left out, as a TLS-terminating proxy in front changes it). ``null`` never does."""
    return urlsplit(origin).netloc.lower() == host.lower() != ""


class SameOriginWrites:
    """ASGI middleware answering 403 to a write whose ``Origin`` is another site's."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] in WRITE_METHODS:
            headers = dict(scope["headers"])
            origin = headers.get(b"origin")
            host = headers.get(b"host", b"").decode("latin-1")
            if origin is not None and not is_same_origin(origin.decode("latin-1"), host):
                await _refuse(send, 403, "writes are taken only from the inspector's own pages", [])
                return
        await self.app(scope, receive, send)


class KeyRequired:
    """ASGI middleware answering 401 (with a Basic challenge) to any request without the key."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        detail = "the inspector key is missing or wrong"
        await _refuse(send, 401, detail, [(b"www-authenticate", REALM)])

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                key = presented_key(value.decode("latin-1"))
                return key is not None and hmac.compare_digest(key.encode(), self.key)
        return False
