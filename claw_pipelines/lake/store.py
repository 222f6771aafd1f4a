"""The lake's store: the storage options that make commits safe for many writers, and the check
every service runs at start.

A Delta commit is the creation of the log entry ``_delta_log/<version>.json``; several writers
(proxies on several machines, Dagster runs) are safe only if the store refuses to create an entry
that exists, so that the loser retries at the next version instead of overwriting the winner.
A local disk does it with ``link``; delta-rs 1.6 on S3 with a conditional PUT
(``If-None-Match: *``, object_store's ``conditional_put = etag``), on GCS and Azure with their
native create-if-absent. delta-rs 1.6 has no S3 locking provider any more (the DynamoDB log store
was removed: ``AWS_S3_LOCKING_PROVIDER`` only logs an error), and ``AWS_S3_ALLOW_UNSAFE_RENAME``
is the opt-out of mutual exclusion. So on S3 the project states ``conditional_put = etag`` itself
and refuses the settings that turn it off; the store must honour ``If-None-Match`` (AWS S3 does
since 2024, as do MinIO and Cloudflare R2).
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path

from deltalake.fs import DeltaStorageHandler

S3_SCHEMES = ("s3", "s3a")
SAFE_S3_COMMITS = {"conditional_put": "etag"}
"""Merged into the storage options of an ``s3://`` lake: today's object_store default, stated so
that neither an ``AWS_CONDITIONAL_PUT`` in the environment nor a change of default can turn it
off unseen."""

_TRUTHY = {"1", "true", "on", "yes", "y"}  # as delta-rs reads a boolean option
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_S3_ERROR = re.compile(r"<\?xml.*?<Code>(?P<code>[^<]*)</Code>(?:<Message>(?P<message>[^<]*))?.*")


class LakeStoreError(ValueError):
    """The lake's store is unreachable, unwritable, or configured or behaving so that concurrent
    commits could overwrite each other; the message is one line that says which and what to do."""


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def _s3_keys(options: Mapping[str, str]) -> dict[str, str]:
    """Options by the names object_store and delta-rs match them on (case and ``aws_`` prefix
    do not count: ``AWS_CONDITIONAL_PUT`` and ``conditional_put`` are one option)."""
    return {key.lower().removeprefix("aws_"): value for key, value in options.items()}


def store_options(
    root: str, options: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The storage options the lake opens its store with: ``options``, plus on S3 the
    conditional put commits rely on. Raises ``LakeStoreError`` for a setting (in ``options`` or
    in the ``AWS_*`` variables delta-rs also reads) under which they would not be safe."""
    merged = dict(options)
    if _scheme(root) not in S3_SCHEMES:
        return merged
    aws_environ = {k: v for k, v in environ.items() if k.upper().startswith("AWS_")}
    given = _s3_keys(aws_environ) | _s3_keys(options)
    if given.get("s3_allow_unsafe_rename", "").strip().lower() in _TRUTHY:
        raise LakeStoreError(
            "AWS_S3_ALLOW_UNSAFE_RENAME is set (CLAW_STORAGE_OPTIONS or the environment): it "
            "turns off the mutual exclusion of Delta commits; remove it, several writers commit "
            "safely to S3 with conditional puts"
        )
    if given.get("s3_locking_provider"):
        raise LakeStoreError(
            "AWS_S3_LOCKING_PROVIDER is set: delta-rs 1.6 has no S3 locking provider (its "
            "DynamoDB log store was removed) and commits with conditional puts; remove it"
        )
    conditional_put = given.get("conditional_put")
    if conditional_put is not None and conditional_put.strip().lower() != "etag":
        raise LakeStoreError(
            f"conditional_put is {conditional_put!r}: Delta commits to S3 need conditional puts "
            "(If-None-Match); remove the option or set it to 'etag'"
        )
    if conditional_put is None:
        merged.update(SAFE_S3_COMMITS)
    return merged


def one_line(error: BaseException) -> str:
    """An object store's error as one readable line: no colours, and an S3 XML error body
    reduced to its code and message."""
    text = " ".join(_ANSI.sub("", str(error)).split())
    return _S3_ERROR.sub(
        lambda m: f"{m['code']}: {m['message']}" if m["message"] else m["code"], text
    )


def check_store(root: str, options: Mapping[str, str] | None) -> None:
    """Fail a process at start rather than in its first commit: write and delete a probe at
    the lake root, through delta-rs's store and the lake's options as commits will reach it.
    Raises ``LakeStoreError`` with one line (wrong endpoint, missing bucket, bad credentials).

    Whether the store honours If-None-Match cannot be probed this way: delta-rs looks up the
    latest version before each commit, so only two commits racing reach the refusal.
    """
    try:
        if not is_remote(root):
            _probe_local(root)
            return
        store = DeltaStorageHandler(root, dict(options or {}) or None)
        probe = f"_claw_write_probe_{secrets.token_hex(8)}"
        store.open_output_stream(probe).close()
        store.delete_file(probe)
    except Exception as error:  # the store's errors come as OSError, DeltaError and others
        raise LakeStoreError(
            f"cannot write to the lake {root} ({one_line(error)}); fix CLAW_LAKE_URI or "
            "CLAW_STORAGE_OPTIONS"
        ) from error


def _probe_local(root: str) -> None:
    """A plain file, not delta-rs's local store, which can spin on a directory that refuses
    new files (such as /proc)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=root, prefix="_claw_write_probe_"):
        pass
