"""How eagerly Dagster reacts to new data (``CLAW_DAGSTER_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OrchestrationSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLAW_DAGSTER_", extra="ignore")

    sensor_interval_s: int = Field(
        default=5,
        ge=1,
        description="Minimum interval of the ingest, automation and batch planner sensors.",
    )
