"""Request bodies as the proxy accepts them: bounded in size, UTF-8, and JSON that every reader
of the stored row can use.

Both the HTTP edge (LiteLLM's routes) and the ``/claw/v1`` endpoints read bodies through here, so
one limit and one set of rules hold on every route. A body is refused with a ``BodyRejected``
naming the problem and, where there is one, the field (``messages[0].content``):
- over ``max_body_bytes`` (413);
- not UTF-8, not JSON, not an object (400);
- nested deeper than ``MAX_DEPTH`` (400): the scrubber and LiteLLM walk bodies recursively;
- ``NaN``/``Infinity`` or a number too large for a float (400): stored JSON must stay JSON;
- a string with a lone UTF-16 surrogate (``"\\ud800"``, 400): it cannot be encoded as UTF-8.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from claw_pipelines.capture import json_text

MAX_DEPTH = 64
"""Deeper than any chat request or tool schema needs, and far from Python's recursion limit."""
_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyRejected(ValueError):
    """A body the proxy will not accept; ``status`` is 413 or 400, ``field`` the path, if any."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


Receive = Callable[[], Awaitable[dict[str, Any]]]


async def read_body(receive: Receive, max_bytes: int) -> bytes | None:
    """The whole body of an ASGI request (None if the client went away), refused with 413 as
    soon as it passes ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise BodyRejected(413, f"request body exceeds {max_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def replay(body: bytes) -> Receive:
    """An ASGI ``receive`` that hands an app the body already read, then waits like a client
    that has nothing more to send."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """The body's JSON object (None for an empty body), or ``BodyRejected`` (400)."""
    if not body:
        return None
    value = json_text.loads(body)
    if value is None:
        return _parse_with_json(body)
    if not isinstance(value, dict):
        raise BodyRejected(400, "request body must be a JSON object")
    deep = body.count(b"[") + body.count(b"{") > MAX_DEPTH
    _refuse_problem(value, _Suspects(deep=deep, strings=False, numbers=False))
    return value


def _parse_with_json(body: bytes) -> dict[str, Any]:
    """The body parsed by ``json``, whose hooks and errors name what the rules refuse."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BodyRejected(400, "request body is not valid UTF-8") from error
    non_finite = _NonFiniteNumbers()
    try:
        value = json.loads(text, parse_constant=non_finite.constant, parse_float=non_finite.number)
    except RecursionError as error:
        raise BodyRejected(400, f"request body is nested deeper than {MAX_DEPTH} levels") from error
    except ValueError as error:  # JSONDecodeError, or an integer of over 4300 digits
        raise BodyRejected(400, f"request body is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise BodyRejected(400, "request body must be a JSON object")
    suspects = _Suspects(
        deep=body.count(b"[") + body.count(b"{") > MAX_DEPTH,
        strings=b"\\ud" in body or b"\\uD" in body,
        numbers=bool(non_finite.seen),
    )
    _refuse_problem(value, suspects)
    return value


def _refuse_problem(value: dict[str, Any], suspects: _Suspects) -> None:
    """``BodyRejected`` naming the first value the rules refuse, if the suspects say to look."""
    problem = _first_problem(value, suspects) if suspects.any else None
    if problem is not None:
        path, what = problem
        field = path_text(path)
        raise BodyRejected(400, f"{field or 'request body'}: {what}", field or None)


NON_FINITE = object()
"""What ``NaN``, ``Infinity`` and a number too large for a float parse to, so the walk can name
where they are."""


@dataclass(frozen=True)
class _NonFiniteNumbers:
    """``json.loads`` hooks that turn non-finite numbers into ``NON_FINITE``, noting each."""

    seen: list[str] = field(default_factory=list)

    def constant(self, text: str) -> object:
        """JSON's extension literals: ``NaN``, ``Infinity``, ``-Infinity``."""
        self.seen.append(text)
        return NON_FINITE

    def number(self, text: str) -> object:
        """A float literal, unless it overflows (``1e999``)."""
        value = float(text)
        if value - value == 0:  # inf - inf is nan
            return value
        self.seen.append(text)
        return NON_FINITE


@dataclass(frozen=True)
class _Suspects:
    """What the parse and the raw bytes say a body may hold, so most bodies are not walked."""

    deep: bool
    strings: bool
    numbers: bool

    @property
    def any(self) -> bool:
        return self.deep or self.strings or self.numbers


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _first_problem(value: dict[str, Any], suspects: _Suspects) -> tuple[tuple, str] | None:
    """The path and problem of the first value the rules refuse, walking without recursion.

    Looking for depth alone, a list of plain values (a million token IDs) is skipped in one C
    loop over its item types.
    """
    strings, numbers = suspects.strings, suspects.numbers
    stack: list[tuple[Any, tuple, int]] = [(value, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path, f"nested deeper than {MAX_DEPTH} levels"
        plain = isinstance(node, list) and not (strings or numbers)
        if plain and _SCALARS.issuperset(map(type, node)):
            continue
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in items:
            if strings and isinstance(key, str) and _SURROGATE.search(key):
                return (*path, key), "key has a lone UTF-16 surrogate (not valid Unicode text)"
            if isinstance(item, dict | list):
                stack.append((item, (*path, key), depth + 1))
            elif item is NON_FINITE:
                return (*path, key), "not a finite number (NaN, Infinity or too large)"
            elif strings and isinstance(item, str) and _SURROGATE.search(item):
                return (*path, key), "has a lone UTF-16 surrogate (not valid Unicode text)"
    return None


def path_text(path: tuple, shown: int = 8) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content`` (a deep path cut at ``shown``;
    a lone surrogate in a key escaped, so the message itself can be sent)."""
    text = ""
    for part in path[:shown]:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = part.encode("utf-8", "backslashreplace").decode()
            text += f".{name}" if text else name
    return text + ("…" if len(path) > shown else "")
