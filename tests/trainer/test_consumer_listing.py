"""``BatchConsumer.batches`` (``claw batches list``) before anyone acked a batch."""

from __future__ import annotations

from pathlib import Path

from claw_pipelines.trainer import BatchConsumer


def test_batches_lists_before_the_first_ack(tmp_path: Path) -> None:
    listed = BatchConsumer("grpo", consumer="c", lake_uri=str(tmp_path)).batches()
    assert listed.columns == [
        "batch_id",
        "planned_at",
        "exported",
        "trainer_step",
        "acked_at",
        "acked",
    ]
    assert listed.is_empty()
