"""How eagerly Dagster reacts to new data (``CLAW_DAGSTER_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OrchestrationSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLAW_DAGSTER_", extra="ignore")

    sensor_interval_s: int = Field(
        default=1,
        ge=1,
        description="Minimum interval of the ingest and automation sensors. Dagster's daemons "
        "evaluate sensors every 5 s at most; an interval of 5 s would skip every tick that "
        "comes a moment early, so the default lets each daemon loop evaluate them.",
    )
