"""The lake as a Dagster resource, so every asset and sensor reads and writes the same root."""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
from pydantic import Field

from claw_pipelines.lake import Lake
from claw_pipelines.settings import ClawSettings, get_settings

_SECRET_OPTION = re.compile(r"SECRET|TOKEN|PASSWORD|CREDENTIAL|ACCESS_KEY|SAS|_KEY$", re.IGNORECASE)


def _is_secret(option: str) -> bool:
    return bool(_SECRET_OPTION.search(option))


class LakeResource(dg.ConfigurableResource):
    """Root of the Delta tables (a local path or ``s3://bucket/prefix``).

    Resource config is shown in the Dagster UI, so it only holds non-secret storage options;
    secret ones (and the standard ``AWS_*`` variables delta-rs reads itself) come from the
    environment of the process that opens the lake.
    """

    lake_uri: str = Field(description="Lake root: local path or object-store URI.")
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="Non-secret delta-rs storage options, e.g. AWS_REGION, AWS_ENDPOINT_URL.",
    )
    max_commit_retries: int = Field(default=100, ge=0)

    @classmethod
    def from_settings(cls, settings: ClawSettings) -> LakeResource:
        local = "://" not in settings.lake_uri or settings.lake_uri.startswith("file://")
        root = settings.lake_uri.removeprefix("file://")
        return cls(
            lake_uri=str(Path(root).absolute()) if local else settings.lake_uri,
            storage_options={
                k: v for k, v in settings.storage_options.items() if not _is_secret(k)
            },
            max_commit_retries=settings.max_commit_retries,
        )

    def lake(self) -> Lake:
        secrets = {k: v for k, v in get_settings().storage_options.items() if _is_secret(k)}
        return Lake(self.lake_uri, {**self.storage_options, **secrets}, self.max_commit_retries)
