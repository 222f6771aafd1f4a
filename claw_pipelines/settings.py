"""Runtime configuration: pydantic settings read from ``CLAW_*`` environment variables.

The defaults are the embedded setup (local lake under ``.claw/``, loopback, embedded engine),
so nothing needs configuring to try the project.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import DirectoryPath, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOCAL_MASTER_KEY = "sk-claw-local"
"""The documented key used when the proxy binds to loopback and LITELLM_MASTER_KEY is unset."""


class ClawSettings(BaseSettings):
    """Where the lake, spool and configuration live and how the capture path commits."""

    model_config = SettingsConfigDict(env_prefix="CLAW_", extra="ignore")

    lake_uri: str = Field(
        default=".claw/lake",
        description="Root of the Delta tables: a local path or an object-store URI such as s3://bucket/lake.",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs storage options (JSON in CLAW_STORAGE_OPTIONS), e.g. AWS_REGION.",
    )
    spool_dir: Path = Field(
        default=Path(".claw/spool"),
        description="Local directory of per-process spool segments (must be a local disk).",
    )
    config_dir: DirectoryPath | None = Field(
        default=None,
        description="A folder whose batches.yaml, rewards.yaml, quality.yaml, litellm.yaml or "
        "dagster.yaml replace the shipped ones, file by file (config_files).",
    )
    run_dir: Path = Field(
        default=Path(".claw/run"),
        description="Where `claw proxy` writes the LiteLLM config it runs with.",
    )
    fsync: Literal["answer", "interval"] = Field(
        default="interval",
        description="'answer': group-commit fsync before each answer leaves; "
        "'interval': fsync every fsync_interval_ms in the background.",
    )
    fsync_interval_ms: int = Field(default=100, ge=1, le=200)
    flush_max_rows: int = Field(default=512, ge=1, description="Commit once this many rows wait.")
    flush_interval_s: float = Field(
        default=1.0, gt=0, description="Commit once no row has come for this long."
    )
    flush_max_wait_s: float = Field(
        default=5.0,
        gt=0,
        description="Under continuous traffic, commit once the oldest row has waited this long.",
    )
    commit_window_s: float = Field(
        default=1.0,
        ge=0,
        description="At most one commit per landing table per window: completions and rewards "
        "closing within it land together in the window's commit.",
    )
    commit_mode: Literal["direct", "staged"] = Field(
        default="direct",
        description="direct: each proxy worker commits its rows to the landing tables. staged: "
        "each stages them in the lake (_staging/) and one process of the fleet, holding the "
        "commit lease, commits everyone's once per commit window: for a fleet past a few "
        "writers on one lake (docs/deployment.md).",
    )
    max_commit_retries: int = Field(default=100, ge=0)
    maintenance_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="Each proxy worker tries a maintenance pass of the landing tables this "
        "often; a lease in the lake lets one process run at a time. 0: never (Dagster's "
        "landing_maintenance schedule only).",
    )
    vacuum_retention_hours: int = Field(
        default=168,
        ge=0,
        description="Files compaction merged away are deleted this long after; a reader may "
        "lag this much (longer: the vacuum waits for the slowest reader).",
    )
    vacuum_enforce_retention: bool = Field(
        default=True,
        description="Refuse a vacuum retention shorter than the table's "
        "delta.deletedFileRetentionDuration (maintenance sets the log retention).",
    )
    log_retention_minutes: int = Field(
        default=5,
        ge=5,
        description="Log entries and checkpoints are deleted this long after (the landing "
        "tables' delta.logRetentionDuration), unless a reader has yet to read them; older "
        "versions can no longer be read by version.",
    )
    run_history_hours: int = Field(
        default=24,
        ge=1,
        description="Dagster's successful runs (their events and logs), the landing tables' "
        "runless materializations and the automation evaluations are deleted this long after "
        "(the dagster_history schedule); the runs of each asset's latest materialization stay.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="The largest request body any proxy route accepts (413 beyond).",
    )
    proxy_keep_alive_s: int = Field(
        default=75,
        ge=1,
        description="How long the proxy keeps an idle client connection open: longer than "
        "clients and load balancers keep theirs (5 s in httpx and the openai and anthropic "
        "SDKs, 60 s on AWS's), so none sends a request on a connection the proxy is closing.",
    )
    prompt_cache_mb: int = Field(
        default=256,
        ge=0,
        description="Memory per proxy process for each trajectory's last two calls, so a turn "
        "stores only what it adds to them (0: every turn stored whole).",
    )
    pause_max_hold_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a model call is held by a weight-sync pause before a 503.",
    )
    inspector_key: str | None = Field(
        default=None,
        description="Key every inspector request needs (Basic auth password or bearer token); "
        "required, >= 24 characters, to bind a non-loopback interface.",
    )

    @field_validator("config_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        """Absolute, so the services ``claw up`` starts in ``.claw/`` read the same folder."""
        return value.absolute() if value is not None else None

    @field_validator("storage_options", mode="before")
    @classmethod
    def _parse_json(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value


@lru_cache(maxsize=1)
def get_settings() -> ClawSettings:
    """The process-wide settings, read once from the environment."""
    return ClawSettings()
