"""Secret scrubbing for every string the project stores: the capture path's rows (messages,
metadata, sampling parameters, errors, a white-box step's text and finish reason) and the
inspector's label notes.

Keys that name credentials lose their values; string values that look like credentials are
replaced wherever they occur, including inside chat messages, and so is any secret registered at
start-up (the master key, the backends' API keys). A key glued to other characters
(``api_key_sk-…``, ``xsk-…``) counts too, when what follows ``sk-`` looks like key material (a
run of 16+ letters and digits with a digit in it), which words and UUIDs glued to ``sk-``
(``task-3fa85f64-…``) do not. ``ScrubbedLogs`` does the same to LiteLLM's log records, which
quote errors a backend may have written a credential into.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import AfterValidator

REDACTED = "[REDACTED]"

SECRET_KEY_PATTERN = re.compile(
    r"^(authorization|proxy-authorization|cookie|set-cookie|bearer|x-goog-api-key|"
    r"(.*[-_])?(api[-_]?key|api[-_]token|secret|secret[-_]access[-_]key|password|passwd|"
    r"access[-_]token|refresh[-_]token|id[-_]token|auth[-_]token|session[-_]token|"
    r"private[-_]key))$",
    re.IGNORECASE,
)
"""Credential-naming keys: ``api_key``, ``x-api-key``, ``openai_api_key``, ``client_secret``…"""
_KEY = r"[A-Za-z0-9_\-]"
SECRET_VALUE_PATTERN = re.compile(
    rf"\bsk-{_KEY}{{6,}}"  # sk-… starting a word
    rf"|sk-{_KEY}*?(?=[A-Za-z]*[0-9])[A-Za-z0-9]{{16,}}{_KEY}*"  # glued: key material after sk-
    r"|(?<![A-Za-z])Bearer\s+[A-Za-z0-9._~+/=\-]{6,}"
    r"|(?<![0-9A-Z])AKIA[0-9A-Z]{16}(?![0-9A-Z])"  # AWS access key id
)


def may_hold_secret_values(value: str) -> bool:
    """False when ``SECRET_VALUE_PATTERN`` cannot match ``value``: each of its matches starts
    with ``sk-``, ``Bearer`` or ``AKIA``. Looking for those is a substring search, while the
    pattern tries its four branches at every character (about a millisecond for 18 KB of prose,
    and a long chat's messages are scrubbed on every call)."""
    return "sk-" in value or "Bearer" in value or "AKIA" in value


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` contains something shaped like a credential (``sk-…``, bearer, AWS key)."""
    return may_hold_secret_values(value) and SECRET_VALUE_PATTERN.search(value) is not None


@lru_cache(maxsize=4096)
def names_a_secret(key: str) -> bool:
    """Whether a key names a credential (``SECRET_KEY_PATTERN``); cached, as the same few keys
    (``role``, ``content``, ``type``…) come back in every message of every call."""
    return SECRET_KEY_PATTERN.match(key) is not None


def _refuse_secret(value: str) -> str:
    if looks_like_secret(value):
        raise ValueError("looks like a secret (sk-… key or bearer token); it would be stored as is")
    return value


NotSecret = AfterValidator(_refuse_secret)
"""For strings stored verbatim (ids, names, labels), which scrubbing must not rewrite: one shaped
like a secret is refused instead."""


def _backend_keys() -> list[str]:
    """``litellm_params.api_key`` of every model in the proxy config, ``os.environ/NAME`` read."""
    path = os.environ.get("CONFIG_FILE_PATH")
    if not path or not Path(path).is_file():
        return []
    config = yaml.safe_load(Path(path).read_text()) or {}
    keys = [
        str((entry.get("litellm_params") or {}).get("api_key") or "")
        for entry in config.get("model_list") or []
    ]
    prefix = "os.environ/"
    return [os.environ.get(k.removeprefix(prefix), "") if k.startswith(prefix) else k for k in keys]


class Redactor:
    """Scrubs known secrets and credential-shaped values from nested JSON-like data."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    @classmethod
    def from_environment(cls) -> Redactor:
        """One that also knows this process's secrets: the master key and the backends' API
        keys of the proxy config (``CONFIG_FILE_PATH``), which a backend's error may echo."""
        return cls([os.environ.get("LITELLM_MASTER_KEY", ""), *_backend_keys()])

    def add_secret(self, secret: str | None) -> None:
        if secret and len(secret) >= 6 and secret not in self._secrets:
            self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        if not may_hold_secret_values(value):
            return value
        return SECRET_VALUE_PATTERN.sub(REDACTED, value)

    def data(self, value: object) -> object:
        """A scrubbed copy of dicts/lists/strings; credential-named keys lose their values."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                key: REDACTED if isinstance(key, str) and names_a_secret(key) else self.data(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.data(item) for item in value]
        return value


LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Proxy", "LiteLLM Router")


class ScrubbedLogs(logging.Filter):
    """Rewrites a log record's message and traceback with the redactor's secrets taken out.

    LiteLLM scrubs its own patterns from its logs, but not the secrets only this process knows
    (a backend key that looks like nothing in particular, echoed in a backend's error).
    """

    _formatter = logging.Formatter()

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: logging reports it as such
            return True
        record.msg = self.redactor.text(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.text(record.exc_text)
        return True

    def install(self, names: Iterable[str] = LITELLM_LOGGERS) -> None:
        for name in names:
            logging.getLogger(name).addFilter(self)
