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
    sensor_wait_s: float = Field(
        default=3.0,
        ge=0,
        le=4,
        description="How long a tick of the ingest sensor waits for a completion, a reward or a "
        "label to land before it reports what else landed. Dagster's sensor daemon begins a tick "
        "at most every 5 s, so a completion would wait 2.5 s on average for the next one; a tick "
        "that is waiting hands it to the refresh run within a poll (0.25 s). Turns alone are "
        "reported up to this much later. 0: report at once.",
    )
