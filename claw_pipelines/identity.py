"""Who a turn belongs to: trajectory, group, channel, agent and policy version.

An agent can say it three ways and none is required: the ``/t/<trajectory>/<group>/v1`` base-URL
prefix (zero code change; the proxy turns it into headers), ``x-claw-*`` headers, or
``metadata: {"claw": {...}}`` in the body. Headers win over body metadata. Values are validated
here so a bad one is a clear 400, never a silently wrong row. A value shaped like a secret is
refused rather than scrubbed: ids are join keys, and a rewritten one would join wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated
from urllib.parse import unquote

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from claw_pipelines.redaction import NotSecret

PolicyVersion = Annotated[int, Field(ge=0, le=2**63 - 1, strict=True)]
"""Strict: ``1.0`` or ``true`` is not a version (pydantic would otherwise coerce them to 1).
Bounded by the table's int64 column, so a larger one is a 400, not an unlandable row."""
IdentityValue = Annotated[
    str,
    StringConstraints(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$"),
    NotSecret,
]

HEADER_FIELDS = {
    "x-claw-trajectory": "trajectory_id",
    "x-claw-group": "group_id",
    "x-claw-policy-version": "policy_version",
    "x-claw-channel": "channel",
    "x-claw-agent": "agent",
}
IDENTITY_FIELDS = tuple(HEADER_FIELDS.values())


class IdentityError(ValueError):
    """The agent sent an identity value we cannot accept; the message says which and why."""


class TurnIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trajectory_id: IdentityValue | None = None
    group_id: IdentityValue | None = None
    channel: IdentityValue | None = None
    agent: IdentityValue | None = None
    policy_version: PolicyVersion | None = None


def identity_from_request(
    headers: Mapping[str, str], claw_metadata: Mapping[str, object] | None
) -> TurnIdentity:
    """Merge header and body identity (headers win) and validate it."""
    unknown = sorted(
        name for name in headers if name.startswith("x-claw-") and name not in HEADER_FIELDS
    )
    if unknown:
        raise IdentityError(
            f"unknown identity header(s) {', '.join(unknown)}; known: {', '.join(HEADER_FIELDS)}"
        )
    if claw_metadata is not None and not isinstance(claw_metadata, Mapping):
        raise IdentityError("metadata.claw must be a JSON object")
    values: dict[str, object] = {
        name: claw_metadata[name]
        for name in IDENTITY_FIELDS
        if claw_metadata and claw_metadata.get(name) is not None
    }
    values |= {
        field: _header_value(field, headers[header])
        for header, field in HEADER_FIELDS.items()
        if header in headers
    }
    try:
        return TurnIdentity.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise IdentityError(f"invalid claw identity: {problems}") from error


def _header_value(field: str, raw: str) -> object:
    """A header value as the id or version it carries.

    The server decodes header bytes as latin-1 (HTTP's default); an id sent as UTF-8, as the
    base-URL prefix turns ``/t/r%C3%A9/...`` into, is decoded back. A policy version written as
    plain digits is that integer.
    """
    try:
        text = raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        text = raw
    if field == "policy_version" and text.isascii() and text.isdigit():
        return int(text)
    return text


def split_identity_prefix(raw_path: str) -> tuple[str, str, str] | None:
    """``/t/<trajectory>/<group>/v1/x`` -> (trajectory, group, "/v1/x"), ``/t/<t>/<g>`` -> (t, g,
    "/"); None if no prefix.

    Takes the raw (still percent-encoded) path, so an id may contain an encoded ``/`` and is
    decoded exactly once; the rest of the path is returned still encoded.
    """
    if not raw_path.startswith("/t/"):
        return None
    parts = raw_path.split("/", 4)
    if len(parts) < 4 or not parts[2] or not parts[3]:
        return None
    return unquote(parts[2]), unquote(parts[3]), "/" + (parts[4] if len(parts) == 5 else "")
