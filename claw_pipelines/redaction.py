"""Secret scrubbing for every string the project stores: the capture path's rows (messages,
metadata, sampling parameters, errors, a white-box step's text and finish reason) and the
inspector's label notes.

Keys that name credentials lose their values, and a key that is itself a credential is scrubbed
like any other string. String values shaped like credentials are replaced wherever they occur
(``CREDENTIAL_SHAPES`` lists the shapes), and so is any secret registered at start-up (the
master key, the backends' API keys). ``ScrubbedLogs`` does the same to LiteLLM's log records,
which quote errors a backend may have written a credential into.

The patterns are our own: the credential-pattern libraries on PyPI cost too much on a path that
scrubs every call (detect-secrets: 1.7 s for a 50k-token request; kingfisher: a 36 MB native
rule set, 0.4 s to compile and 60 µs a string, and in our samples it missed an ``sk-proj-``
key, and an AWS key id and a JWT inside a 250 KB request).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import AfterValidator

REDACTED = "[REDACTED]"

SECRET_KEY_PATTERN = re.compile(
    r"^(authorization|proxy-authorization|cookie|set-cookie|bearer|x-goog-api-key|"
    r"(.*[-_]|aws)?(api[-_]?key|api[-_]?token|secret|secret[-_]?access[-_]?key|password|passwd|"
    r"access[-_]?token|refresh[-_]?token|id[-_]?token|auth[-_]?token|session[-_]?token|"
    r"private[-_]?key))$",
    re.IGNORECASE,
)
"""Credential-naming keys: ``api_key``, ``x-api-key``, ``client_secret``, ``SecretAccessKey``…
(a camelCase key is also tried with ``_`` between its words)."""
_KEY = r"[A-Za-z0-9_\-]"
_TOKEN = r"[A-Za-z0-9._~+/=\-]"


@dataclass(frozen=True)
class CredentialShape:
    """One shape of credential, tried only on text that holds one of its marks: a substring
    search is cheap, while ``re`` tries a pattern at every character (about 2 ms for a
    50k-token request; a request has thousands of short strings too). A case-insensitive
    pattern starts with its ``lower_mark`` and is tried only where the lower-cased text holds
    it."""

    name: str
    pattern: re.Pattern[str]
    mark: re.Pattern[str] | None = None
    lower_mark: str | None = None

    def scrub(self, value: str, lowered: str) -> str:
        if self.mark is not None:
            if self.mark.search(value) is not None:
                return self.pattern.sub(_replacement, value)
            return value
        if self.lower_mark in lowered:
            return _scrub_at_marks(self, value, lowered)
        return value


AWS_ID_PREFIXES = ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "ABIA", "ACCA")
"""Access key ids (``AKIA``, ``ASIA`` temporary), and the ids of users, roles, groups…"""
_AWS_ID_MARK = re.compile("|".join(AWS_ID_PREFIXES))
_GITHUB_MARK = re.compile("gh[pousr]_|github_pat_")
CREDENTIAL_SHAPES = (
    CredentialShape(
        "OpenAI/Anthropic-style key: sk-… starting a word, or glued to other characters when "
        "key material follows (16+ letters and digits with a digit)",
        re.compile(
            rf"sk-(?:(?<=\bsk-){_KEY}{{6,}}|{_KEY}*?(?=[A-Za-z]*[0-9])[A-Za-z0-9]{{16,}}{_KEY}*)"
        ),
        mark=re.compile("sk-"),
    ),
    CredentialShape(
        "bearer token, any case: one with a digit, or 24+ characters (not 'bearer tokens')",
        re.compile(
            rf"bearer(?<![A-Za-z]......)\s+(?:(?={_TOKEN}*[0-9]){_TOKEN}{{8,}}|{_TOKEN}{{24,}})",
            re.IGNORECASE,
        ),
        lower_mark="bearer",
    ),
    CredentialShape(
        "JWT (header.payload.signature)",
        re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
        mark=re.compile("eyJ"),
    ),
    CredentialShape(
        "AWS access key id (AKIA, ASIA temporary) and user, role and group ids",
        re.compile(rf"(?:{'|'.join(AWS_ID_PREFIXES)})(?<![0-9A-Z]....)[0-9A-Z]{{16}}(?![0-9A-Z])"),
        mark=_AWS_ID_MARK,
    ),
    CredentialShape(
        "GitHub token (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
        re.compile(r"g(?:h[pousr]_[A-Za-z0-9]{36,}|ithub_pat_[A-Za-z0-9_]{22,})"),
        mark=_GITHUB_MARK,
    ),
    CredentialShape(
        "AWS secret access key after its name (aws_secret_access_key=…, SecretAccessKey: …)",
        re.compile(
            r"(?P<name>secret[-_ ]?access[-_ ]?key[\\\"'\s]*[:=][\\\"'\s]*)"
            r"[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])",
            re.IGNORECASE,
        ),
        lower_mark="secret",
    ),
)
"""What ``Redactor.text`` replaces in any string (docs/durability.md lists them)."""
_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _replacement(match: re.Match[str]) -> str:
    """What a match becomes: the name before an AWS secret access key stays."""
    return (match.groupdict().get("name") or "") + REDACTED


def _marked(value: str, lowered: str) -> bool:
    """Whether any shape's mark is in ``value``: one expression, as most of a request's
    strings (roles, ids, names, short texts) hold none and each costs this much only."""
    return (
        "sk-" in value
        or "eyJ" in value
        or "bearer" in lowered
        or "secret" in lowered
        or ("_" in value and _GITHUB_MARK.search(value) is not None)
        or _AWS_ID_MARK.search(value) is not None
    )


def _scrub_shapes(value: str) -> str:
    lowered = value.lower()
    if not _marked(value, lowered):
        return value
    for shape in CREDENTIAL_SHAPES:
        scrubbed = shape.scrub(value, lowered)
        if scrubbed is not value:
            value, lowered = scrubbed, scrubbed.lower()
    return value


def _scrub_at_marks(shape: CredentialShape, value: str, lowered: str) -> str:
    """``shape`` replaced where it matches at an occurrence of its mark in ``lowered``, which
    lines up with ``value`` unless lower-casing changed its length (then all of it is tried)."""
    if len(lowered) != len(value):
        return shape.pattern.sub(_replacement, value)
    mark = shape.lower_mark or ""
    pieces: list[str] = []
    done = 0
    start = lowered.find(mark)
    while start != -1:
        match = shape.pattern.match(value, start)
        if match is None:
            start = lowered.find(mark, start + 1)
            continue
        pieces += [value[done:start], _replacement(match)]
        done = match.end()
        start = lowered.find(mark, done)
    return "".join([*pieces, value[done:]]) if pieces else value


@lru_cache(maxsize=4096)
def _scrubbed_key(key: str) -> str:
    return _scrub_shapes(key)


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` contains something shaped like a credential (``CREDENTIAL_SHAPES``)."""
    return _scrub_shapes(value) != value


@lru_cache(maxsize=4096)
def names_a_secret(key: str) -> bool:
    """Whether a key names a credential (``SECRET_KEY_PATTERN``); cached, as the same few keys
    (``role``, ``content``, ``type``…) come back in every message of every call."""
    return any(
        SECRET_KEY_PATTERN.match(form) is not None for form in (key, _CAMEL_HUMP.sub("_", key))
    )


def _refuse_secret(value: str) -> str:
    if looks_like_secret(value):
        raise ValueError("looks like a secret (a key or token); it would be stored as is")
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


MEMO_MIN_CHARS = 256
"""Strings from this long are remembered scrubbed (``ScrubMemo``)."""
MEMO_MAX_CHARS = 16 * 2**20


class ScrubMemo:
    """Long strings and their scrubbed form, by content, within ``max_chars`` (least recently
    used forgotten first). An agent sends its whole conversation again on every call, so most
    of a request's text was scrubbed on the call before: looking it up costs a hash and a
    compare, scrubbing it again the marks' searches over all of it (~0.7 ms at 50k tokens).
    Locked: the log filter scrubs from any thread."""

    def __init__(self, max_chars: int = MEMO_MAX_CHARS) -> None:
        self.max_chars = max_chars
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def scrubbed(self, value: str, scrub: Callable[[str], str]) -> str:
        with self._lock:
            found = self._texts.get(value)
            if found is not None:
                self._texts.move_to_end(value)
                return found
        result = scrub(value)
        size = len(value) + (0 if result is value else len(result))
        if size > self.max_chars:
            return result
        with self._lock:
            if value not in self._texts:
                self._texts[value] = result
                self._chars += size
            while self._chars > self.max_chars:
                old, scrubbed = self._texts.popitem(last=False)
                self._chars -= len(old) + (0 if scrubbed is old else len(scrubbed))
        return result

    def clear(self) -> None:
        with self._lock:
            self._texts.clear()
            self._chars = 0


class Redactor:
    """Scrubs known secrets and credential-shaped values from nested JSON-like data."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)
        self._memo = ScrubMemo()

    @classmethod
    def from_environment(cls) -> Redactor:
        """One that also knows this process's secrets: the master key and the backends' API
        keys of the proxy config (``CONFIG_FILE_PATH``), which a backend's error may echo."""
        return cls([os.environ.get("LITELLM_MASTER_KEY", ""), *_backend_keys()])

    def add_secret(self, secret: str | None) -> None:
        if secret and len(secret) >= 6 and secret not in self._secrets:
            self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)
            self._memo.clear()

    def text(self, value: str) -> str:
        if len(value) < MEMO_MIN_CHARS:
            return self._scrubbed(value)
        return self._memo.scrubbed(value, self._scrubbed)

    def _scrubbed(self, value: str) -> str:
        return _scrub_shapes(self._without_secrets(value))

    def key(self, key: str) -> str:
        """A dict key scrubbed as text; the same few keys come back in every message."""
        return _scrubbed_key(self._without_secrets(key))

    def _without_secrets(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value

    def data(self, value: object) -> object:
        """A scrubbed copy of dicts/lists/strings; credential-named keys lose their values, and
        keys are scrubbed as text (``{"sk-proj-…": 1}``)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                self.key(key) if isinstance(key, str) else key: REDACTED
                if isinstance(key, str) and names_a_secret(key)
                else self.data(item)
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
