"""Trajectory sequences and the arrays and datasets a trainer reads from a sequence batch,
checked against the turns the engine answered."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError
from transform_rows import SYSTEM, at, chain, event, events, rewards, turn, turns

from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.planner import plan_batch
from claw_pipelines.derived_schemas import SEQUENCE_ROWS, conform
from claw_pipelines.exporters import Destination, export_batch
from claw_pipelines.exporters.export import in_layout, verl_layout
from claw_pipelines.exporters.trl import trl_frames
from claw_pipelines.exporters.verl import verl_arrays
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
)
from claw_pipelines.transforms.reward_rules import RewardConfig
from claw_pipelines.transforms.sequences import sequence_rows, sequences


def _session(trajectory_id: str, group_id: str, base: int, start: float) -> list[dict]:
    """Three prefix-consistent calls (reply, 2 observation tokens, reply, ...), then a call
    whose context was edited (its system prompt's last token changed): a second segment."""
    calls = chain(trajectory_id, 3, group_id=group_id, base=base, start=start)
    last = calls[-1]
    edited = [*SYSTEM[:-1], 7, *last["prompt_token_ids"][len(SYSTEM) :],
              *last["response_token_ids"], base + 300]  # fmt: skip
    reply = [base + 400, base + 401, base + 402]
    calls.append(turn(f"{trajectory_id}-3", edited, reply, start=start + 30,
                      trajectory_id=trajectory_id, group_id=group_id))  # fmt: skip
    return calls


def _plan(recipe: Recipe, rows: list[dict], values: dict[str, float]):
    landed = rewards(*[{"trajectory_id": t, "value": v} for t, v in values.items()])
    steps = extract_steps(turns(*rows), None, events(*[event(t) for t in values]), now=at(90)).steps
    curated = curate_steps(
        score_steps(reward_steps(steps, landed, None, RewardConfig()), steps, QualityConfig()),
        None,
    )
    return plan_batch(recipe, curated, turns(*rows), None, at(100))


def _recipe(**fields) -> Recipe:
    return Recipe.model_validate({"name": "grpo", "group_size": 2, "groups_per_batch": 1,
                                  "filters": {"min_quality": 0}, **fields})  # fmt: skip


GROUP = _session("a", "g", 0, 0) + _session("b", "g", 1000, 1)


def test_a_segment_is_the_engine_tokens_with_the_mask_exactly_on_replies():
    landed = turns(*GROUP)
    plan = _plan(_recipe(), GROUP, {"a": 1.0, "b": 0.0})
    rows = sequence_rows(plan.planned, landed)
    conform(rows, SEQUENCE_ROWS)
    assert rows.select("trajectory_id", "segment_index", "break_reason").rows() == [
        ("a", 0, None), ("a", 1, "context_edit"), ("b", 0, None), ("b", 1, "context_edit"),
    ]  # fmt: skip
    by_turn = {row["turn_id"]: row for row in landed.iter_rows(named=True)}
    for row in rows.iter_rows(named=True):
        last = by_turn[row["turn_id"]]
        tokens = row["prompt_token_ids"] + row["response_token_ids"]
        assert tokens == last["prompt_token_ids"] + last["response_token_ids"]
        first = by_turn[row["turn_ids"][0]]
        assert row["prompt_token_ids"] == first["prompt_token_ids"]
        replies = np.zeros(len(row["response_token_ids"]), dtype=np.int8)
        for span, turn_id in zip(row["spans"], row["turn_ids"], strict=True):
            reply = by_turn[turn_id]["response_token_ids"]
            assert span["turn_id"] == turn_id and span["end"] - span["start"] == len(reply)
            assert row["response_token_ids"][span["start"] : span["end"]] == reply
            replies[span["start"] : span["end"]] = 1
        assert row["response_mask"] == replies.tolist()
        logprobs = np.array(row["response_logprobs"])
        assert (logprobs[replies == 1] == -0.5).all() and (logprobs[replies == 0] == 0).all()
    a0 = rows.row(0, named=True)
    assert a0["response_mask"] == [1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    assert (a0["segment_steps"], a0["num_segments"], a0["num_steps"]) == (3, 2, 4)
    assert rows.get_column("is_last").to_list() == [False, True, False, True]


def test_only_each_segment_last_prompt_is_read():
    """Every other prompt is left out of the turns given: the sequences are the same."""
    landed = turns(*GROUP)
    plan = _plan(_recipe(), GROUP, {"a": 1.0, "b": 0.0})
    lasts = {"a-2", "a-3", "b-2", "b-3"}
    blanked = landed.with_columns(
        pl.when(pl.col("turn_id").is_in(lasts)).then("prompt_token_ids").alias("prompt_token_ids")
    )
    assert sequence_rows(plan.planned, blanked).equals(sequence_rows(plan.planned, landed))
    assert in_layout(_recipe(), plan.rows).equals(sequence_rows(plan.planned, landed))


def test_prompts_given_as_suffixes_build_the_same_sequences():
    """The tokens each call added since the previous call's prompt + reply (the whole prompt
    on a segment's first step) concatenate with the replies to the same sequences."""
    plan = _plan(_recipe(), GROUP, {"a": 1.0, "b": 0.0})
    steps = plan.rows
    previous_end = (
        (pl.col("prompt_len") + pl.col("response_len"))
        .shift(1)
        .over("trajectory_id", "segment_index", order_by="step_index")
    )
    suffixes = steps.with_columns(
        pl.col("prompt_token_ids").list.slice(previous_end.fill_null(0)).alias("prompt_token_ids")
    )
    assert suffixes["prompt_token_ids"].list.len().sum() < steps["prompt_len"].sum()
    assert sequences(suffixes, prompts_are_suffixes=True).equals(sequences(steps))


def test_a_sequence_batch_becomes_arrays_of_fixed_widths_that_concatenate_and_chunk():
    recipe = _recipe(prompt_length=32, response_length=16, pad_to_multiple=4)
    first = in_layout(recipe, _plan(recipe, GROUP, {"a": 1.0, "b": 0.0}).rows)
    short = chain("c", 2, group_id="h", base=2000) + chain("d", 1, group_id="h", base=3000)
    second = in_layout(recipe, _plan(recipe, short, {"c": 1.0, "d": 0.0}).rows)
    arrays = [verl_arrays(rows, verl_layout(recipe)) for rows in (first, second)]
    for rows, (tensors, non_tensors) in zip((first, second), arrays, strict=True):
        assert all(a.shape[0] % 4 == 0 for a in [*tensors.values(), *non_tensors.values()])
        assert tensors["input_ids"].shape[1] == 48 and tensors["responses"].shape[1] == 16
        assert tensors["input_ids"].dtype == tensors["response_mask"].dtype == np.int64
        assert tensors["rollout_log_probs"].dtype == tensors["rm_scores"].dtype == np.float32
        for i, row in enumerate(rows.iter_rows(named=True)):
            width = len(row["response_mask"])
            assert tensors["response_mask"][i, :width].tolist() == row["response_mask"]
            assert tensors["response_mask"][i, width:].sum() == 0
            last_reply_end = row["spans"][-1]["end"]  # the row's reward counts once
            assert tensors["rm_scores"][i, last_reply_end - 1] == pytest.approx(row["reward"])
            assert tensors["rm_scores"][i].sum() == pytest.approx(row["reward"])
            assert row["reward"] == row["spans"][-1]["reward"]
        pads = non_tensors["is_pad"]
        assert pads.sum() == len(pads) - rows.height
        assert tensors["response_mask"][pads].sum() == 0
    joined = {name: np.concatenate([a[0][name] for a in arrays]) for name in arrays[0][0]}
    assert joined["input_ids"].shape == (8, 48)  # 4 + 2 rows, each batch padded to 4
    keys = arrays[0][1]["batch_keys"][:4].tolist()
    assert keys == ["g_0_0", "g_0_1", "g_1_0", "g_1_1"]  # uid, session, segment


def test_a_row_too_long_follows_the_truncation_rule_and_says_why():
    recipe = _recipe(prompt_length=32, response_length=8, truncation="left")
    rows = in_layout(recipe, _plan(recipe, GROUP, {"a": 1.0, "b": 0.0}).rows)
    tensors, non_tensors = verl_arrays(rows, verl_layout(recipe))
    assert non_tensors["truncated"][0] == "response 10 tokens > 8: kept its first ones"
    assert non_tensors["truncated"][1] is None
    assert tensors["response_mask"][0].tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    strict = _recipe(prompt_length=32, response_length=8)
    plan = _plan(strict, GROUP, {"a": 1.0, "b": 0.0})
    assert set(plan.dropped.get_column("reason")) == {"response_too_long", "trajectory_filtered"}


def test_trl_rollouts_zero_observations_and_preference_tokens_are_dpo_ready(tmp_path):
    recipe = _recipe()
    rows = in_layout(recipe, _plan(recipe, GROUP, {"a": 1.0, "b": 0.0}).rows)
    rollouts, _ = trl_frames("grpo", rows)["rollouts.parquet"]
    assert rollouts["env_mask"].to_list() == rows["response_mask"].to_list()
    assert rollouts["completion_ids"].to_list() == rows["response_token_ids"].to_list()
    assert set(rollouts["tokenizer"]) == {"policy"}
    prompts, _ = trl_frames("grpo", rows)["prompts.parquet"]
    assert prompts["prompt"][0].to_list()[0]["content"] == "q-a-0"  # the group's first state

    prompt = [*SYSTEM, 2]
    pair = [turn("good", prompt, [1], trajectory_id="t1", group_id="p"),
            turn("bad", prompt, [2, 3], trajectory_id="t2", group_id="p", start=1)]  # fmt: skip
    dpo = Recipe(name="dpo", algorithm="dpo", groups_per_batch=1, min_reward_gap=0.5)
    assert dpo.layout == "step"
    manifest = export_batch(dpo, _plan(dpo, pair, {"t1": 1.0, "t2": 0.0}).rows,
                            Destination(str(tmp_path)))  # fmt: skip
    assert manifest.layout == "step" and manifest.tokenizer == "policy"
    tokens = pl.read_parquet(tmp_path / "trl/preference_tokens.parquet")
    # the columns DPOTrainer's dataset preparation produces and its collator takes
    assert tokens.select("prompt_ids", "chosen_ids", "rejected_ids").row(0) == (prompt, [1], [2, 3])
    with pytest.raises(ValidationError, match="layout"):
        Recipe(name="dpo", algorithm="dpo", layout="sequence")


def test_exported_sequences_match_the_rows_and_the_manifest_says_so(tmp_path):
    recipe = _recipe(exports=["verl", "trl", "jsonl"], prompt_length=32, response_length=16)
    manifest = export_batch(recipe, _plan(recipe, GROUP, {"a": 1.0, "b": 0.0}).rows,
                            Destination(str(tmp_path)))  # fmt: skip
    assert manifest.layout == "sequence" and manifest.rows == 4
    assert manifest.verl_layout.prompt_length == 32 and manifest.verl_layout.pad_to_multiple == 8
    assert {f.path: f.rows for f in manifest.files}["verl/batch.parquet"] == 8
    lines = (tmp_path / "jsonl/sequences.jsonl").read_text().splitlines()
    assert [json.loads(line)["segment_index"] for line in lines] == [0, 1, 0, 1]
    non_tensor = pl.read_parquet(tmp_path / "verl/non_tensor.parquet")
    spans = json.loads(non_tensor["spans"][0])
    assert [s["turn_id"] for s in spans] == ["a-0", "a-1", "a-2"]


def test_group_statistics_stay_per_trajectory_across_its_segments():
    recipe = _recipe(group_statistics="per_trajectory", credit_assignment={"method": "broadcast"})
    rows = in_layout(recipe, _plan(recipe, GROUP, {"a": 1.0, "b": 0.0}).rows)
    advantage = dict(rows.group_by("trajectory_id").agg(pl.col("advantage").unique()).iter_rows())
    scores = np.array([1.0, 0.0])  # one per trajectory, whatever its segments
    expected = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
    assert advantage == {"a": [pytest.approx(expected[0])], "b": [pytest.approx(expected[1])]}
    tensors, _ = verl_arrays(rows, verl_layout(recipe))
    mask = tensors["response_mask"][: rows.height]
    assert np.allclose(
        tensors["advantages"][: rows.height], rows["advantage"].to_numpy()[:, None] * mask
    )
