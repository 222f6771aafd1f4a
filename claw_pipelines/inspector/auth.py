"""The inspector's key: with ``CLAW_INSPECTOR_KEY`` set, every page, API call and static file
needs it (``serve`` refuses to bind a non-loopback interface without a strong one).

A browser sends it as the password of HTTP Basic authentication (it asks once, then sends it
with every page and every ``fetch`` of the page's script); a script may send it as a bearer
token. Any user name is accepted: the key is what authenticates.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json

REALM = b'Basic realm="claw inspector", charset="UTF-8"'


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


class KeyRequired:
    """ASGI middleware answering 401 (with a Basic challenge) to any request without the key."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "the inspector key is missing or wrong"}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", REALM),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                key = presented_key(value.decode("latin-1"))
                return key is not None and hmac.compare_digest(key.encode(), self.key)
        return False
