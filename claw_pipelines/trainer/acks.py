"""``batch_consumption/<recipe>``: which batches each named consumer (a trainer) trained on.

Append-only, one row per ack; a batch acked twice (a trainer that crashed after its ack landed
and acked again) counts once.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

import polars as pl
from pydantic import Field

from claw_pipelines.batches.names import consumption_table
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import LandingRow, UtcTimestamp, new_id, rows_to_arrow, utc_now


class BatchAck(LandingRow):
    """A consumer's durable record that it trained on a batch."""

    table_name: ClassVar[str] = "batch_consumption"
    key: ClassVar[str] = "ack_id"

    ack_id: str = Field(default_factory=new_id)
    recipe: str
    batch_id: str
    consumer: str
    trainer_step: int | None = Field(default=None, description="The trainer's step, if it has one.")
    acked_at: UtcTimestamp = Field(default_factory=utc_now)


def acked_batches(lake: Lake, recipe: str, consumer: str) -> set[str]:
    """The batches ``consumer`` acked (one column of its rows)."""
    acks = lake.scan(consumption_table(recipe))
    if acks is None:
        return set()
    found = acks.filter(pl.col("consumer") == consumer).select("batch_id").unique().collect()
    return set(found.get_column("batch_id"))


ACK_SCHEMA = {
    "consumer": pl.String,
    "batch_id": pl.String,
    "trainer_step": pl.Int64,
    "acked_at": pl.Datetime("us", "UTC"),
}
"""The columns ``acks_of`` answers, also before the first ack."""


def acks_of(lake: Lake, recipe: str) -> pl.DataFrame:
    """Every consumer's first ack of each batch: consumer, batch_id, trainer_step, acked_at."""
    acks = lake.scan(consumption_table(recipe))
    if acks is None:
        return pl.DataFrame(schema=ACK_SCHEMA)
    return (
        acks.sort("acked_at")
        .group_by("consumer", "batch_id", maintain_order=True)
        .first()
        .select("consumer", "batch_id", "trainer_step", "acked_at")
        .collect()
    )


def record_ack(
    lake: Lake, recipe: str, consumer: str, batch_id: str, trainer_step: int | None = None
) -> datetime:
    """Commit one ack (durable once this returns) and return its time."""
    ack = BatchAck(recipe=recipe, batch_id=batch_id, consumer=consumer, trainer_step=trainer_step)
    lake.append(consumption_table(recipe), rows_to_arrow(BatchAck, [ack.model_dump()]))
    return ack.acked_at
