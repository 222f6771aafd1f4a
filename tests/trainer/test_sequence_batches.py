"""What a trainer reads from sequence batches in a lake (``Batch.load``): the batch written and
exported as the batch assets do it, then its arrays and datasets checked against the turns."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

from claw_pipelines.batches.names import exports_folder
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batches.rows import completed_chunks, stored_rows
from claw_pipelines.batching.building import write_batch
from claw_pipelines.batching.planner import BatchPlan, plan_batch
from claw_pipelines.exporters import Destination, export_chunks
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn, rows_to_arrow
from claw_pipelines.trainer import Batch
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
)
from claw_pipelines.transforms.reward_rules import RewardConfig

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RECIPE = Recipe(name="grpo", group_size=2, groups_per_batch=1, filters={"min_quality": 0},
                prompt_length=64, response_length=48)  # fmt: skip


def _session(trajectory_id: str, group_id: str, calls: int, base: int, start: float) -> list[dict]:
    """``calls`` engine turns, each prompt the previous prompt + reply + a 3-token tool output."""
    rows, prompt = [], [base + i for i in range(20)]
    for i in range(calls):
        reply = [base + 100 + 10 * i + k for k in range(2 + i % 3)]
        at = T0 + timedelta(seconds=start + 10 * i)
        rows.append(
            Turn(
                turn_id=f"{trajectory_id}-{i}", trajectory_id=trajectory_id, group_id=group_id,
                agent="solver", policy_version=1, model="policy", token_source="engine",
                finish_reason="stop", prompt_token_ids=prompt, response_token_ids=reply,
                response_logprobs=[-0.25] * len(reply), started_at=at,
                ended_at=at + timedelta(seconds=1),
                request_messages=json.dumps([{"role": "user", "content": f"task {group_id}"}]),
                response_message=json.dumps({"role": "assistant", "content": f"a{i}"}),
            ).model_dump()
        )  # fmt: skip
        prompt = [*prompt, *reply, base + 200 + i, base + 201 + i, base + 202 + i]
    return rows


def _land(lake: Lake, rows: list[dict], outcomes: dict[str, tuple[str, float]]) -> pl.DataFrame:
    """Land the turns and completions; the curated steps the refresh would make of them."""
    events = [TrajectoryEventRow(trajectory_id=t, group_id=g, reward=r, created_at=T0 + timedelta(
        minutes=5)).model_dump() for t, (g, r) in outcomes.items()]  # fmt: skip
    lake.append("turns", rows_to_arrow(Turn, rows))
    turns = pl.from_arrow(rows_to_arrow(Turn, rows))
    landed = pl.from_arrow(rows_to_arrow(TrajectoryEventRow, events))
    steps = extract_steps(turns, None, landed, now=T0 + timedelta(minutes=10)).steps
    rewarded = reward_steps(steps, None, landed, RewardConfig())
    return curate_steps(score_steps(rewarded, steps, QualityConfig()), None).collect()


def _exported(
    lake: Lake, curated: pl.DataFrame, ledger: pl.DataFrame | None
) -> tuple[Batch, BatchPlan]:
    """Plan, write and export the next batch as the batch assets do, and load it."""
    plan = plan_batch(RECIPE, curated, lake.scan_landed("turns"), ledger, T0 + timedelta(hours=1))
    assert plan.ready
    write_batch(lake, RECIPE, plan)
    stored = stored_rows(lake, RECIPE.name, RECIPE.algorithm, plan.batch_id)
    out = Destination(lake.uri(f"{exports_folder(RECIPE.name)}/{plan.batch_id}"))
    export_chunks(RECIPE, completed_chunks(lake, RECIPE.algorithm, stored, RECIPE.layout), out)
    return Batch.load(lake, RECIPE.name, plan.batch_id), plan


def test_sequence_batches_read_back_as_arrays_that_concatenate_and_chunk(tmp_path: Path):
    lake = Lake(str(tmp_path / "lake"))
    rows = [*_session("a", "g", 4, 0, 0), *_session("b", "g", 2, 1000, 1),
            *_session("c", "h", 1, 2000, 60), *_session("d", "h", 3, 3000, 61)]  # fmt: skip
    curated = _land(lake, rows, {"a": ("g", 1.0), "b": ("g", 0.0), "c": ("h", 1.0),
                                 "d": ("h", 0.0)})  # fmt: skip
    first, plan = _exported(lake, curated, None)
    second, _ = _exported(lake, curated, plan.ledger_rows(RECIPE.name, T0))
    turns = {row["turn_id"]: row for row in rows}
    arrays = []
    for batch, trajectories in ((first, ["a", "b"]), (second, ["c", "d"])):
        assert batch.manifest.layout == "sequence" and batch.manifest.tokenizer == "policy"
        assert batch.rows["trajectory_id"].to_list() == trajectories  # one sequence each
        tensors, non_tensors = batch.to_verl()  # the recipe's widths and row multiple
        assert tensors["prompts"].shape == (8, 64) and tensors["responses"].shape == (8, 48)
        assert all(len(column) == 8 for column in non_tensors.values())  # chunk(4), chunk(8)
        for i, row in enumerate(batch.rows.iter_rows(named=True)):
            last = turns[row["turn_id"]]
            assert row["prompt_token_ids"] + row["response_token_ids"] == (
                last["prompt_token_ids"] + last["response_token_ids"]
            )
            mask = tensors["response_mask"][i]
            replies = [turns[t]["response_token_ids"] for t in row["turn_ids"]]
            assert mask.sum() == sum(len(reply) for reply in replies)
            kept = tensors["responses"][i][mask == 1].tolist()
            assert kept == [token for reply in replies for token in reply]
            assert (tensors["rollout_log_probs"][i][mask == 1] == -0.25).all()
            assert (tensors["rollout_log_probs"][i][mask == 0] == 0).all()
        rollouts = batch.to_trl("rollouts")
        assert rollouts["env_mask"] == batch.rows["response_mask"].to_list()
        assert set(rollouts["tokenizer"]) == {"policy"}
        arrays.append(tensors)
    joined = {name: np.concatenate([a[name] for a in arrays]) for name in arrays[0]}
    assert joined["input_ids"].shape == (16, 112) and joined["input_ids"].dtype == np.int64
