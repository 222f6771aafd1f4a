"""A trainer over the real stack: demo agents through the real proxy land turns in the lake of a
real ``dagster dev``, its sensors build and export GRPO batches, and ``BatchConsumer`` (and
``claw batches``) take them, ack them and resume."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from stack_fixtures import CaptureStack, launch_stack

from claw_pipelines.demo import AGENT, run_demo
from claw_pipelines.trainer import Batch, BatchConsumer

DEADLINE_S = 600.0
CLAW = [sys.executable, "-m", "claw_pipelines.cli"]


@pytest.fixture(scope="module")
def traffic(dagster_dev) -> Iterator[CaptureStack]:
    """The real proxy and engine writing into the live Dagster's lake, and demo rounds played
    through them (in a thread) for as long as the module's tests run."""
    stack = launch_stack(Path(dagster_dev.lake.root).parent)
    stop = threading.Event()

    def play() -> None:
        while not stop.is_set():
            run_demo(prompts=8, rollouts=4, proxy_url=stack.proxy_url, concurrency=8,
                     key=stack.key, lake=stack.lake)  # fmt: skip

    player = threading.Thread(target=play, daemon=True)
    player.start()
    try:
        yield stack
    finally:
        stop.set()
        player.join(timeout=300)
        stack.proxy.stop()
        stack.engine.stop()


def _demo_batch(consumer: BatchConsumer, stack: CaptureStack) -> Batch:
    """The next batch of the demo agents' trajectories (acking any other, such as the synthetic
    batch another test landed in this lake)."""
    while True:
        batch = consumer.next(timeout_s=DEADLINE_S)
        assert batch is not None, "no batch from the demo traffic"
        demo = stack.rows("turns").filter(pl.col("agent") == AGENT).select("turn_id")
        if batch.rows.join(demo, on="turn_id").height == batch.rows.height:
            return batch
        consumer.ack(batch.batch_id)


def test_next_returns_the_batch_the_sensors_built_from_real_traffic(dagster_dev, traffic):
    consumer = BatchConsumer("grpo", consumer="trainer-a", lake_uri=dagster_dev.lake.root)
    batch = _demo_batch(consumer, traffic)
    landed = traffic.rows("turns").select("turn_id", "agent", "prompt_token_ids",
                                          "response_token_ids", "model")  # fmt: skip
    assert batch.manifest.layout == "sequence"  # the shipped grpo recipe's rows
    joined = batch.rows.join(landed, on="turn_id", suffix="_landed")  # a sequence's last turn
    assert joined.height == batch.rows.height and set(joined["agent"]) == {AGENT}
    sequence = pl.concat_list("prompt_token_ids", "response_token_ids")
    engine = pl.concat_list("prompt_token_ids_landed", "response_token_ids_landed")
    assert (
        joined.select(sequence.alias("s"))["s"].to_list()
        == joined.select(engine.alias("e"))["e"].to_list()
    )
    assert joined["model"].to_list() == joined["model_landed"].to_list()
    assert [m.model for m in batch.manifest.models] == joined["model"].unique().to_list()
    assert batch.manifest.tokenizer == joined["model"][0]
    assert batch.rows.get_column("group_id").n_unique() == 4
    order = batch.rows.select("group_id", "trajectory_id", "segment_index")
    assert order.equals(order.sort("group_id", "trajectory_id", "segment_index"))
    consumer.ack(batch.batch_id, trainer_step=1)


def test_an_ack_survives_a_restart_and_every_consumer_sees_every_batch(dagster_dev, traffic):
    root = dagster_dev.lake.root
    first = BatchConsumer("grpo", consumer="trainer-b", lake_uri=root)
    taken = first.next(timeout_s=DEADLINE_S)
    other = BatchConsumer("grpo", consumer="trainer-c", lake_uri=root).next(timeout_s=DEADLINE_S)
    assert taken is not None and other is not None
    assert other.batch_id == taken.batch_id  # oldest first, for each consumer name
    first.ack(taken.batch_id, trainer_step=7)

    restarted = BatchConsumer("grpo", consumer="trainer-b", lake_uri=root)
    following = restarted.next(timeout_s=DEADLINE_S)
    assert following is not None and following.batch_id > taken.batch_id
    unacked = BatchConsumer("grpo", consumer="trainer-b", lake_uri=root).next(timeout_s=DEADLINE_S)
    assert unacked.batch_id == following.batch_id  # taken, never acked: it comes back

    listed = subprocess.run(
        [*CLAW, "batches", "list", "--recipe", "grpo", "--consumer", "trainer-b", "--lake", root],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    states = dict(line.split("\t")[::2] for line in listed.splitlines())
    assert states[taken.batch_id] == "acked step 7"
    assert states[following.batch_id] == "exported"

    waited = subprocess.run(
        [*CLAW, "batches", "wait", "--recipe", "grpo", "--consumer", "trainer-b", "--lake", root,
         "--timeout", "60"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    summary = json.loads(waited)
    assert summary["batch_id"] == following.batch_id
    assert Path(summary["export"], "manifest.json").exists()
    subprocess.run(
        [*CLAW, "batches", "ack", "--recipe", "grpo", "--consumer", "trainer-b", "--lake", root,
         "--batch", following.batch_id, "--step", "8"], check=True,
    )  # fmt: skip
    after = BatchConsumer("grpo", consumer="trainer-b", lake_uri=root)
    assert after.batches().filter(pl.col("acked")).get_column("batch_id").to_list()[-2:] == [
        taken.batch_id, following.batch_id,
    ]  # fmt: skip


def _check_against_rows(tensors: dict, non_tensors: dict, rows: pl.DataFrame, width_p: int):
    """Sequence rows (the shipped grpo layout): the mask is 1 exactly on the steps' replies."""
    for i, row in enumerate(rows.iter_rows(named=True)):
        prompt, response = row["prompt_token_ids"], row["response_token_ids"]
        assert tensors["prompts"][i, width_p - len(prompt) :].tolist() == prompt
        assert tensors["responses"][i, : len(response)].tolist() == response
        assert tensors["attention_mask"][i].sum() == len(prompt) + len(response)
        replies = np.zeros(tensors["response_mask"].shape[1], dtype=np.int64)
        for span in row["spans"]:
            replies[span["start"] : span["end"]] = 1
        last_reply_end = row["spans"][-1]["end"]  # the row's reward, counted once
        assert tensors["rm_scores"][i, last_reply_end - 1] == pytest.approx(row["reward"])
        assert tensors["rm_scores"][i].sum() == pytest.approx(row["reward"])
        assert tensors["response_mask"][i].tolist() == replies.tolist()
        logprobs = tensors["rollout_log_probs"][i, : len(response)]
        assert np.allclose(logprobs, row["response_logprobs"])
        assert (logprobs[replies[: len(response)] == 0] == 0).all()
        assert non_tensors["uid"][i] == row["group_id"]
        assert non_tensors["__num_turns__"][i] == 2 * row["segment_steps"]


def test_two_batches_become_fixed_width_arrays_that_concatenate(dagster_dev, traffic):
    consumer = BatchConsumer("grpo", consumer="trainer-d", lake_uri=dagster_dev.lake.root)
    batches = [_demo_batch(consumer, traffic), _demo_batch(consumer, traffic)]
    width_p = max(b.rows["prompt_token_ids"].list.len().max() for b in batches) + 3
    width_r = max(b.rows["response_token_ids"].list.len().max() for b in batches) + 2
    arrays = [b.to_verl(prompt_length=width_p, response_length=width_r, pad_token_id=5,
                        pad_to_multiple=8) for b in batches]  # fmt: skip
    for batch, (tensors, non_tensors) in zip(batches, arrays, strict=True):
        rows = batch.rows.height
        padded = -(-rows // 8) * 8
        assert tensors["input_ids"].shape == (padded, width_p + width_r)
        assert tensors["prompts"].dtype == np.int64 and tensors["rm_scores"].dtype == np.float32
        assert all(a.flags.writeable and a.shape[0] == padded for a in tensors.values())
        assert all(a.shape == (padded,) for a in non_tensors.values())
        _check_against_rows(tensors, non_tensors, batch.rows, width_p)
        pads = non_tensors["is_pad"]
        assert pads.sum() == padded - rows and not pads[:rows].any()
        assert tensors["response_mask"][pads].sum() == 0 and tensors["rm_scores"][pads].sum() == 0
        assert (tensors["prompts"][pads] == 5).all()
    joined = {k: np.concatenate([a[0][k] for a in arrays]) for k in arrays[0][0]}
    assert joined["input_ids"].shape[1] == width_p + width_r
    with pytest.raises(ValueError, match="do not fit the widths"):
        batches[0].to_verl(prompt_length=1, truncation="error")
    cut, cut_non_tensors = batches[0].to_verl(prompt_length=1)  # the recipe's truncation: left
    assert cut["prompts"].shape[1] == 1 and cut_non_tensors["truncated"][0].startswith("prompt")
