"""``claw demo --online``: the demo also plays the trainer, while its agents keep running.

For each exported GRPO batch it does what an online trainer does around a weight sync: pause the
proxy's model calls (in-flight ones finish), "train" (there is no GPU here: a short sleep stands
in for the update and the weight sync), announce policy version + 1 (which resumes the calls),
and ack the batch. The agents' turns after each announce carry the new version, so the
inspector shows several versions in flight, and once the trainer is more than the recipe's
``max_policy_lag`` versions ahead, steps left over from old versions are left out as ``stale``.
"""

from __future__ import annotations

import threading
import time

from pydantic import BaseModel

from claw_pipelines.trainer import BatchConsumer, PolicyClient

CONSUMER = "claw-demo-trainer"
DRAIN_TIMEOUT_S = 30.0
LOOK_EVERY_S = 1.0
"""How often the waiting trainer checks whether the demo asked it to stop."""


class TrainedStep(BaseModel):
    """One pretend training step: the batch it took and the version it announced after it."""

    batch_id: str
    rows: int
    version: int
    waited_s: float
    """From the step's start (the previous announce, or the demo's start) to the batch."""


class TrainerRun(BaseModel):
    steps: list[TrainedStep]
    timed_out: bool


def play_trainer(
    consumer: BatchConsumer,
    policy: PolicyClient,
    steps: int,
    timeout_s: float,
    train_s: float,
    stop: threading.Event,
) -> TrainerRun:
    """Train on ``steps`` batches (or until ``stop`` is set or ``timeout_s`` passes without a
    batch), announcing one policy version per batch."""
    version = policy.current().version or 0
    trained: list[TrainedStep] = []
    started = time.monotonic()
    while len(trained) < steps and not stop.is_set():
        if time.monotonic() - started > timeout_s:
            return TrainerRun(steps=trained, timed_out=True)
        batch = consumer.next(timeout_s=LOOK_EVERY_S)
        if batch is None:
            continue
        waited_s = time.monotonic() - started
        policy.pause(drain_timeout_s=DRAIN_TIMEOUT_S)
        time.sleep(train_s)
        version += 1
        policy.announce(version)
        consumer.ack(batch.batch_id, trainer_step=version)
        trained.append(
            TrainedStep(
                batch_id=batch.batch_id, rows=batch.rows.height, version=version, waited_s=waited_s
            )
        )
        started = time.monotonic()
    return TrainerRun(steps=trained, timed_out=False)
