"""Who may reach a service: one bound to loopback is private to this machine; one bound to any
other interface needs a strong key, the same rule for the capture proxy and the inspector."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter

from claw_pipelines.settings import LOCAL_MASTER_KEY

MIN_STRONG_KEY_LENGTH = 24
MIN_STRONG_KEY_BITS = 72
"""Of ``key_bits``: a random 24-character URL-safe key has about 95, hex of 24 characters 84
(one in a hundred falls under 72), ``"password" * 3`` 66, ``"a" * 24`` none."""
STRONG_KEY_HINT = (
    f"use a random key of >= {MIN_STRONG_KEY_LENGTH} characters and >= {MIN_STRONG_KEY_BITS} "
    "bits of character entropy, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address; any other name counts as reachable from outside."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_bits(key: str) -> float:
    """The key's length times the Shannon entropy of its characters: an estimate of how much a
    guesser must try that a repeated or patterned key (``"k" * 40``, ``"abc" * 8``) fails,
    whatever its length."""
    counts = Counter(key).values()
    return sum(n * math.log2(len(key) / n) for n in counts)


def is_strong_key(key: str) -> bool:
    return (
        key != LOCAL_MASTER_KEY
        and len(key) >= MIN_STRONG_KEY_LENGTH
        and key_bits(key) >= MIN_STRONG_KEY_BITS
    )


def key_refusal(host: str, key: str | None, variable: str) -> str | None:
    """Why a service may not bind ``host`` with ``key`` (set in ``variable``), or None if it may.

    Off loopback the key must be strong (``is_strong_key``): long, random-looking, and not the
    documented local key.
    """
    if is_loopback(host):
        return None
    if not key:
        return f"refusing to bind {host} without {variable}; bind 127.0.0.1 or {STRONG_KEY_HINT}"
    if not is_strong_key(key):
        return f"refusing to bind {host} with a weak {variable}; {STRONG_KEY_HINT}"
    return None
