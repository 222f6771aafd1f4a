"""Secret scrubbing for everything the capture path writes (tables and logs).

Keys that name credentials lose their values; string values that look like credentials
(``sk-…`` keys, bearer tokens, and any secret registered at start-up such as the master key)
are replaced wherever they occur, including inside chat messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[REDACTED]"

SECRET_KEY_PATTERN = re.compile(
    r"^(authorization|proxy-authorization|x-api-key|api[-_]?key|apikey|x-litellm-api-key|"
    r"openai[-_]api[-_]key|cookie|set-cookie|password|passwd|secret|client[-_]secret|"
    r"access[-_]token|refresh[-_]token|id[-_]token|aws[-_]secret[-_]access[-_]key|"
    r"aws[-_]session[-_]token|x-goog-api-key|api-token|auth[-_]token|bearer)$",
    re.IGNORECASE,
)
SECRET_VALUE_PATTERN = re.compile(
    r"(\bsk-[A-Za-z0-9_\-]{6,}|\bBearer\s+[A-Za-z0-9._~+/=\-]{6,}|\bAKIA[0-9A-Z]{16}\b)"
)


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` contains something shaped like a credential (``sk-…``, bearer, AWS key)."""
    return SECRET_VALUE_PATTERN.search(value) is not None


class Redactor:
    """Scrubs known secrets and credential-shaped values from nested JSON-like data."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def add_secret(self, secret: str | None) -> None:
        if secret and len(secret) >= 6 and secret not in self._secrets:
            self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return SECRET_VALUE_PATTERN.sub(REDACTED, value)

    def data(self, value: object) -> object:
        """A scrubbed copy of dicts/lists/strings; credential-named keys lose their values."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                key: REDACTED
                if isinstance(key, str) and SECRET_KEY_PATTERN.match(key)
                else self.data(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.data(item) for item in value]
        return value
