"""Who may reach a service: one bound to loopback is private to this machine; one bound to any
other interface needs a strong key, the same rule for the capture proxy and the inspector."""

from __future__ import annotations

import ipaddress

from claw_pipelines.settings import LOCAL_MASTER_KEY

MIN_STRONG_KEY_LENGTH = 24


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address; any other name counts as reachable from outside."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_refusal(host: str, key: str | None, variable: str) -> str | None:
    """Why a service may not bind ``host`` with ``key`` (set in ``variable``), or None if it may.

    Off loopback the key must be random-looking long: at least ``MIN_STRONG_KEY_LENGTH``
    characters and not the documented local key.
    """
    if is_loopback(host):
        return None
    if not key:
        return (
            f"refusing to bind {host} without {variable}; set a strong key "
            f"(>= {MIN_STRONG_KEY_LENGTH} characters) or bind 127.0.0.1"
        )
    if key == LOCAL_MASTER_KEY or len(key) < MIN_STRONG_KEY_LENGTH:
        return (
            f"refusing to bind {host} with a weak {variable}; use a random key of "
            f">= {MIN_STRONG_KEY_LENGTH} characters"
        )
    return None
