"""Batch planning: complete groups, stragglers, zero variance, ledger, DPO pairs, determinism."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
import yaml
from pydantic import ValidationError
from transform_rows import SYSTEM, T0, at, chain, event, events, rewards, turn, turns

from claw_pipelines.batches.pins import Pins
from claw_pipelines.batches.recipe import PINNED, Recipe, load_recipes
from claw_pipelines.batching.ledger import pinned_recipe
from claw_pipelines.batching.planner import final_drops, plan_batch, plan_batches
from claw_pipelines.batching.units import NO_TRAJECTORIES
from claw_pipelines.derived_schemas import BATCH_ROWS, DPO_PAIRS, DROPPED, LEDGER, conform
from claw_pipelines.lake import Lake
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
)
from claw_pipelines.transforms.reward_rules import RewardConfig


def _curated(
    group_rewards: dict[str, list[float]], steps: int = 2
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Curated steps of one trajectory per listed reward, in groups (trajectory ids g:i), and
    the steps they came from (token lists)."""
    rows, evts = [], []
    for g, (group, values) in enumerate(group_rewards.items()):
        for i, value in enumerate(values):
            tid = f"{group}:{i}"
            rows += chain(tid, steps, group_id=group, base=1000 * g + 100 * i, start=g + i / 10)
            evts.append(event(tid, reward=value, group_id=group))
    extracted = extract_steps(turns(*rows), None, events(*evts), now=at(100)).steps
    rewarded = reward_steps(extracted, None, events(*evts), RewardConfig())
    curated = curate_steps(score_steps(rewarded, extracted, QualityConfig()), None).collect()
    return curated, extracted


def _recipe(**fields) -> Recipe:
    return Recipe.model_validate({"name": "grpo", "group_size": 2, "groups_per_batch": 2,
                                  "straggler_timeout_s": 600, **fields})  # fmt: skip


def _reasons(plan) -> dict[str, str]:
    return dict(plan.dropped.select("trajectory_id", "reason").unique().iter_rows())


def test_complete_groups_fill_a_batch_in_deterministic_order():
    curated, steps = _curated({"a": [1, 0], "b": [0, 1, 1], "c": [1, 0], "d": [1]})
    plan = plan_batch(
        _recipe(), curated, steps, None, at(200), source_versions={"curated_steps": 3}
    )
    assert plan.ready and plan.batch_id == "grpo-000001"
    conform(plan.rows, BATCH_ROWS)
    conform(plan.dropped, DROPPED)
    assert (
        plan.rows["trajectory_id"].to_list()
        == ["a:0"] * 2 + ["a:1"] * 2 + ["b:0"] * 2 + ["b:1"] * 2
    )
    assert plan.rows["step_index"].to_list() == [0, 1] * 4
    assert plan.rows["is_last"].to_list() == [False, True] * 4
    assert set(plan.rows["group_size"]) == {2} and set(plan.rows["num_steps"]) == {2}
    assert plan.rows.filter(pl.col("trajectory_id") == "a:0")["reward"].to_list() == [0.0, 1.0]
    broadcast = plan_batch(
        _recipe(credit_assignment={"method": "broadcast"}), curated, steps, None, at(200)
    )
    assert broadcast.rows.filter(pl.col("trajectory_id") == "a:0")["reward"].to_list() == [1.0, 1.0]
    assert plan.rows["source_versions"][0] == '{"curated_steps": 3}'
    reasons = _reasons(plan)
    assert reasons == {"b:2": "group_overflow", "c:0": "next_batch", "c:1": "next_batch",
                       "d:0": "waiting_for_group"}  # fmt: skip
    shuffled = curated.sample(fraction=1.0, shuffle=True, seed=7)
    again = plan_batch(
        _recipe(), shuffled, steps, None, at(200), source_versions={"curated_steps": 3}
    )
    assert again.rows.equals(plan.rows) and again.dropped.equals(plan.dropped)


def test_ledger_prevents_double_consumption():
    curated, steps = _curated({"a": [1, 0], "b": [0, 1], "c": [1, 0], "d": [0, 1]})
    first = plan_batch(_recipe(), curated, steps, None, at(200))
    ledger = first.ledger_rows("grpo", at(200))
    conform(ledger, LEDGER)
    assert sorted(ledger["turn_id"]) == sorted(first.rows["turn_id"])
    second = plan_batch(_recipe(), curated, steps, ledger, at(200))
    assert second.ready and second.batch_id == "grpo-000002"
    assert set(second.rows["group_id"]) == {"c", "d"}
    assert not set(second.rows["turn_id"]) & set(first.rows["turn_id"])
    third = plan_batch(
        _recipe(), curated, steps, pl.concat([ledger, second.ledger_rows("grpo", at(201))]), at(200)
    )
    assert not third.ready and third.rows.height == 0


LEDGER_TABLE = "batch_ledger/grpo"


def _reserved_group_by_group(lake: Lake, groups: int):
    """One-step trajectories in groups g0, g1, ... started a second apart, each group reserved
    by its own plan in turn for ``groups`` plans (a ledger file each): the curated steps, their
    token lists, the plans and, per plan, the ledger's files after it."""
    curated, steps = _curated({f"g{g}": [1, 0] for g in range(groups + 1)}, steps=1)
    plans, files = [], []
    for n in range(groups):
        ledger = lake.scan(LEDGER_TABLE)
        plan = plan_batch(_recipe(groups_per_batch=1), curated, steps, ledger, at(200),
                          batch_id=f"grpo-{n + 1:06d}")  # fmt: skip
        lake.append(LEDGER_TABLE, conform(plan.ledger_rows("grpo", at(200)), LEDGER))
        plans.append(plan)
        files.append(set(lake.open(LEDGER_TABLE).file_uris()))
    return curated, steps, plans, files


def test_a_plan_reads_only_the_ledger_files_of_trajectories_started_in_its_window(tmp_path):
    """Plans after many reservations read only the ledger files holding a trajectory first
    started since the earliest one they read: the older ones are gone from disk here."""
    lake = Lake(str(tmp_path))
    curated, steps, plans, files = _reserved_group_by_group(lake, groups=9)
    window = plans[7].open_since_next  # g8 and g9 in play then; g8 reserved since
    assert window == at(8) and set(plans[8].rows["group_id"]) == {"g8"}
    for old in files[7]:
        Path(old).unlink()
    plan = plan_batch(_recipe(groups_per_batch=1), curated, steps, lake.scan(LEDGER_TABLE),
                      at(200), open_since=window, batch_id="grpo-000010")  # fmt: skip
    assert len(files[7]) == 8 and set(plan.rows["group_id"]) == {"g9"}


def test_a_late_step_of_a_trajectory_reserved_long_ago_is_still_left_out(tmp_path):
    """The late step carries its trajectory's first start, so the plan reads the ledger back
    to it, however recent the window of curated steps it reads."""
    lake = Lake(str(tmp_path))
    curated, steps, _, _ = _reserved_group_by_group(lake, groups=9)
    late = curated.filter(pl.col("trajectory_id") == "g0:0").with_columns(
        pl.lit("g0:0-late").alias("turn_id"),
        pl.lit(1, pl.Int32).alias("step_index"),
        pl.lit(at(500)).alias("started_at"),
        pl.lit(at(501)).alias("ended_at"),
    )
    assert late["trajectory_started_at"].to_list() == [at(0)]
    plan = plan_batch(_recipe(groups_per_batch=1), pl.concat([curated, late]), steps,
                      lake.scan(LEDGER_TABLE), at(200), open_since=at(9),
                      batch_id="grpo-000010")  # fmt: skip
    assert set(plan.rows["group_id"]) == {"g9"}
    assert "g0:0" not in set(plan.dropped["trajectory_id"])  # not in play: it was consumed


@pytest.mark.parametrize(
    ("policy", "now", "batch_group", "a_reason", "single_reason"),
    [
        ("emit", 200, "b", "waiting_for_group", "waiting_for_group"),
        ("emit", 5000, "a", None, "straggler_dropped"),
        ("drop", 5000, "b", "straggler_dropped", "straggler_dropped"),
    ],
)
def test_incomplete_groups_wait_then_follow_the_straggler_policy(
    policy, now, batch_group, a_reason, single_reason
):
    curated, steps = _curated({"a": [1, 0], "b": [1, 0, 0, 1], "s": [1]})
    recipe = _recipe(group_size=4, groups_per_batch=1, straggler_policy=policy)
    plan = plan_batch(recipe, curated, steps, None, at(now))
    reasons = _reasons(plan)
    assert plan.ready
    assert set(plan.rows["group_id"]) == {batch_group}
    assert reasons.get("a:0") == a_reason and reasons["s:0"] == single_reason
    assert set(plan.rows["group_size"]) == {2 if batch_group == "a" else 4}


def _quality(curated: pl.DataFrame, low: str) -> pl.DataFrame:
    """``curated`` with trajectory ``low`` under the shipped recipes' quality bar (0.5)."""
    is_low = pl.col("trajectory_id") == low
    return curated.with_columns(
        pl.when(is_low).then(0.1).otherwise(pl.col("quality_score")).alias("quality_score")
    )


@pytest.mark.parametrize("policy", ["emit", "drop"])
def test_a_group_whose_rollouts_all_landed_follows_the_straggler_policy_at_once(policy):
    """Four rollouts of four landed, one under the quality bar: no fourth member can pass, so
    the group does not wait out its 600-s timeout (the plan is at 200 s)."""
    curated, steps = _curated({"q": [1, 0, 1, 0], "r": [1, 0, 1]})
    recipe = _recipe(group_size=4, groups_per_batch=1, straggler_policy=policy,
                     filters={"min_quality": 0.5})  # fmt: skip
    plan = plan_batch(recipe, _quality(curated, "q:3"), steps, None, at(200))
    reasons = _reasons(plan)
    assert reasons["q:3"] == "low_quality" and reasons["r:0"] == "waiting_for_group"
    if policy == "emit":
        assert plan.ready and set(plan.rows["trajectory_id"]) == {"q:0", "q:1", "q:2"}
        assert set(plan.rows["group_size"]) == {3}
        assert set(plan.final["trajectory_id"]) == {"q:3"}
    else:
        assert not plan.ready
        assert {reasons[f"q:{i}"] for i in range(3)} == {"group_short"}
        assert set(plan.final["trajectory_id"]) == {"q:0", "q:1", "q:2", "q:3"}


def test_a_rollout_out_for_good_stays_in_play_until_its_group_mates_land():
    """q:0 lands first, under the quality bar. Retired at once, the next plans would not see
    it and its group would wait out the timeout; held, it keeps the plans' window at its start
    until the other three land, and the group is emitted without waiting."""
    curated, steps = _curated({"q": [1, 0, 1, 0]})
    curated = _quality(curated, "q:0")
    recipe = _recipe(group_size=4, groups_per_batch=1, filters={"min_quality": 0.5})
    early = curated.filter(pl.col("trajectory_id") == "q:0")
    first = plan_batch(recipe, early, steps, None, at(100))
    assert _reasons(first) == {"q:0": "low_quality"} and first.final.is_empty()
    assert first.open_since_next == at(0)
    second = plan_batch(recipe, curated, steps, None, at(200), retired=first.final,
                        open_since=first.open_since_next)  # fmt: skip
    assert second.ready and set(second.rows["trajectory_id"]) == {"q:1", "q:2", "q:3"}
    assert set(second.final["trajectory_id"]) == {"q:0"}
    alone = plan_batch(recipe, early, steps, None, at(5000))
    assert set(alone.final["trajectory_id"]) == {"q:0"}  # the group timed out: nothing to hold


def test_a_rollout_waiting_for_its_reward_does_not_complete_its_group():
    """q:3 has no reward yet: it may still get one, so the group waits for it (and q:3, out
    for now, is retired until its reward lands and voids that)."""
    curated, steps = _curated({"q": [1, 0, 1, 0]})
    unrewarded = pl.when(pl.col("trajectory_id") == "q:3").then(None).otherwise("outcome_reward")
    curated = curated.with_columns(unrewarded.alias("outcome_reward"))
    plan = plan_batch(_recipe(group_size=4, groups_per_batch=1), curated, steps, None, at(200))
    assert _reasons(plan) == {"q:0": "waiting_for_group", "q:1": "waiting_for_group",
                              "q:2": "waiting_for_group", "q:3": "no_reward"}  # fmt: skip
    assert set(plan.final["trajectory_id"]) == {"q:3"}


def test_zero_variance_groups_and_filters_are_dropped_with_reasons():
    curated, steps = _curated({"flat": [1, 1], "ok": [0, 1], "late": [1, 0]})
    curated = curated.with_columns(
        pl.when(pl.col("trajectory_id") == "late:1").then(False).otherwise(pl.col("trainable"))
        .alias("trainable")
    )  # fmt: skip
    plan = plan_batch(_recipe(groups_per_batch=1), curated, steps, None, at(200))
    reasons = _reasons(plan)
    assert reasons["flat:0"] == reasons["flat:1"] == "zero_variance"
    assert reasons["late:1"] == "untrainable" and reasons["late:0"] == "group_short"
    assert set(plan.rows["group_id"]) == {"ok"}
    keep_flat = plan_batch(_recipe(groups_per_batch=1, filters={"drop_zero_variance": False}),
                           curated, steps, None, at(200))  # fmt: skip
    assert set(keep_flat.rows["group_id"]) == {"flat"}


def test_missing_rewards_and_long_prompts_are_filtered():
    curated, steps = _curated({"a": [1, 0], "b": [1, 0]})
    curated = curated.with_columns(
        pl.when(pl.col("group_id") == "a")
        .then(None)
        .otherwise(pl.col("outcome_reward"))
        .alias("outcome_reward")
    )
    recipe = _recipe(layout="step", filters={"max_prompt_len": 22})
    plan = plan_batch(recipe, curated, steps, None, at(200))
    got = plan.dropped.select("turn_id", "reason").sort("turn_id").rows()
    assert got == [
        ("a:0-0", "no_reward"),
        ("a:0-1", "no_reward"),
        ("a:1-0", "no_reward"),
        ("a:1-1", "no_reward"),
        ("b:0-0", "trajectory_filtered"),
        ("b:0-1", "prompt_too_long"),
        ("b:1-0", "trajectory_filtered"),
        ("b:1-1", "prompt_too_long"),
    ]
    assert not plan.ready and plan.rows.height == 0


def test_sequence_lengths_count_the_first_prompt_and_everything_after_it():
    """Two steps (prompts 21 and 25 tokens, replies 2): one sequence of a 21-token prompt and
    a 6-token response (reply, 2 observation tokens, reply), whatever each step's prompt."""
    curated, steps = _curated({"a": [1, 0], "b": [1, 0]})
    kept = plan_batch(_recipe(filters={"max_prompt_len": 21, "max_response_len": 6}),
                      curated, steps, None, at(200))  # fmt: skip
    assert kept.ready and kept.dropped.is_empty()
    assert kept.planned.get_column("segment_index").to_list() == [0] * 8
    cut = plan_batch(_recipe(filters={"max_response_len": 5}), curated, steps, None, at(200))
    assert set(cut.dropped.get_column("reason")) == {"response_too_long"}
    assert cut.dropped.height == 8


def test_a_trajectory_with_an_infrastructure_failure_leaves_its_group_statistics():
    """A failed engine call (status error) is no signal about the policy: the trajectory is
    left out with reason infra_failure, and its group waits for a member to take its place."""
    curated, steps = _curated({"a": [1, 0], "b": [1, 0]})
    failed = curated.with_columns(
        pl.when(pl.col("turn_id") == "a:1-1").then(pl.lit("error")).otherwise("status")
        .alias("status")
    )  # fmt: skip
    plan = plan_batch(_recipe(groups_per_batch=1), failed, steps, None, at(200))
    assert _reasons(plan) == {"a:0": "waiting_for_group", "a:1": "infra_failure"}
    assert set(plan.planned.get_column("trajectory_id")) == {"b:0", "b:1"}
    late = plan_batch(_recipe(groups_per_batch=2), failed, steps, None, at(5000))
    assert _reasons(late)["a:0"] == "straggler_dropped"


def test_a_failed_call_that_left_no_step_drops_its_trajectory_as_infra_failure():
    """The engine failed one call of a:1 before producing tokens: no step records it, but the
    steps' ``failed_calls`` do, so a:1 leaves its group with reason infra_failure."""
    rows, evts = [], []
    for tid, group, value, base in (("a:0", "a", 1, 0), ("a:1", "a", 0, 100),
                                    ("b:0", "b", 1, 200), ("b:1", "b", 0, 300)):  # fmt: skip
        rows += chain(tid, 2, group_id=group, base=base, start=base / 100)
        evts.append(event(tid, reward=value, group_id=group))
    failed = {**rows[3], "turn_id": "a:1-failed", "status": "error", "response_token_ids": None,
              "response_logprobs": None, "started_at": at(5), "ended_at": at(6)}  # fmt: skip
    steps = extract_steps(turns(*rows, failed), None, events(*evts), now=at(100)).steps
    assert "a:1-failed" not in steps.get_column("turn_id")
    rewarded = reward_steps(steps, None, events(*evts), RewardConfig())
    curated = curate_steps(score_steps(rewarded, steps, QualityConfig()), None).collect()
    plan = plan_batch(_recipe(groups_per_batch=1), curated, steps, None, at(200))
    assert _reasons(plan) == {"a:0": "waiting_for_group", "a:1": "infra_failure"}
    assert plan.dropped.filter(pl.col("reason") == "infra_failure").height == 2
    assert set(plan.planned.get_column("trajectory_id")) == {"b:0", "b:1"}


def test_unfinished_trajectories_follow_the_recipe_rule():
    curated, steps = _curated({"a": [1, 0], "b": [1, 0]})
    aborted = curated.with_columns(
        pl.when(pl.col("trajectory_id") == "b:0").then(pl.lit("aborted")).otherwise("close_reason")
        .alias("close_reason")
    )  # fmt: skip
    kept = plan_batch(_recipe(), aborted, steps, None, at(200))
    assert kept.ready
    dropped = plan_batch(_recipe(filters={"unfinished": "drop"}), aborted, steps, None, at(200))
    assert _reasons(dropped)["b:0"] == "unfinished" and not dropped.ready


def _completed(rows: list[dict], values: dict[str, float]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The steps and curated steps of ``rows``' trajectories, each completed with its reward
    in ``values``."""
    landed = rewards(*[{"trajectory_id": t, "value": v} for t, v in values.items()])
    steps = extract_steps(turns(*rows), None, events(*[event(t) for t in values]), now=at(50)).steps
    curated = curate_steps(
        score_steps(reward_steps(steps, landed, None, RewardConfig()), steps, QualityConfig()),
        None,
    ).collect()
    return steps, curated


def test_dpo_pairs_come_from_the_same_state():
    prompt = [*SYSTEM, 1, 2]
    rows = [
        turn("best", prompt, [5], trajectory_id="t1", group_id="g"),
        turn("mid", prompt, [6], trajectory_id="t2", group_id="g", start=1),
        turn("worst", prompt, [7], trajectory_id="t3", group_id="g", start=2),
        turn("other", [*SYSTEM, 9], [7], trajectory_id="t4", group_id="g", start=3),
        turn("close-a", [*SYSTEM, 3], [1], trajectory_id="t5", group_id="h", start=4),
        turn("close-b", [*SYSTEM, 3], [2], trajectory_id="t6", group_id="h", start=5),
    ]
    values = {"t1": 1.0, "t2": 0.5, "t3": 0.0, "t4": 0.0, "t5": 1.0, "t6": 0.8}
    steps, curated = _completed(rows, values)
    recipe = load_recipes("assets/batches.yaml")["dpo"].model_copy(update={"groups_per_batch": 1})
    plan = plan_batch(recipe, curated, steps, None, at(60))
    conform(plan.rows, DPO_PAIRS)
    assert plan.ready
    pair = plan.rows.row(0, named=True)
    assert (pair["turn_id"], pair["rejected_turn_id"]) == ("best", "worst")
    assert (pair["chosen_token_ids"], pair["rejected_token_ids"]) == ([5], [7])
    assert pair["chosen_reward"] - pair["rejected_reward"] == 1.0
    assert sorted(plan.consumed["turn_id"]) == ["best", "worst"]
    assert dict(plan.dropped.select("turn_id", "reason").iter_rows()) == {
        "mid": "no_pair",
        "other": "no_pair",
        "close-a": "no_pair",
        "close-b": "no_pair",
    }
    ledger = plan.ledger_rows("dpo", T0 + timedelta(seconds=60))
    assert plan_batch(recipe, curated, steps, ledger, at(60)).rows.height == 0


def _two_states_and_leftovers() -> tuple[pl.DataFrame, pl.DataFrame]:
    """Steps and curated steps of three dpo states: g pairs s0/s3 and then s1/s2, h pairs
    n0/n3 and leaves n1/n2 under the gap, k's two replies are the same tokens."""
    prompt = [*SYSTEM, 1, 2]
    rows = (
        [
            turn(f"s{i}", prompt, [5 + i], trajectory_id=f"t{i}", group_id="g", start=i)
            for i in range(4)
        ]
        + [
            turn(f"n{i}", [*SYSTEM, 3], [5 + i], trajectory_id=f"u{i}", group_id="h", start=4 + i)
            for i in range(4)
        ]
        + [
            turn(f"k{i}", [*SYSTEM, 4], [9], trajectory_id=f"v{i}", group_id="k", start=8 + i)
            for i in range(2)
        ]
    )
    values = {
        "t0": 1.0,
        "t1": 0.9,
        "t2": 0.2,
        "t3": 0.0,
        "u0": 1.0,
        "u1": 0.6,
        "u2": 0.4,
        "u3": 0.0,
        "v0": 1.0,
        "v1": 0.0,
    }
    return _completed(rows, values)


def test_dpo_leftovers_that_cannot_pair_retire_and_those_that_can_wait():
    """Once a state's best and worst are paired, its steps left wait for a later batch only
    while they still make a pair (a reward gap, different replies); the others are final drops
    (retired until their group changes), so later plans need not start reading at them."""
    steps, curated = _two_states_and_leftovers()
    recipe = load_recipes("assets/batches.yaml")["dpo"].model_copy(update={"groups_per_batch": 2})
    plan = plan_batch(recipe, curated, steps, None, at(60))
    assert sorted(plan.consumed["turn_id"]) == ["n0", "n3", "s0", "s3"]
    assert dict(plan.dropped.select("turn_id", "reason").iter_rows()) == {
        "s1": "next_batch",  # 0.9 against 0.2: a pair once s0 and s3 are consumed
        "s2": "next_batch",
        "n1": "no_pair",  # 0.6 against 0.4: under the 0.5 gap for good
        "n2": "no_pair",
        "k0": "no_pair",  # 1.0 against 0.0 for the same reply: never a pair
        "k1": "no_pair",
    }
    assert sorted(plan.final["turn_id"]) == ["k0", "k1", "n1", "n2"]
    ledger = plan.ledger_rows("dpo", T0 + timedelta(seconds=60))
    later = plan_batch(
        recipe.model_copy(update={"groups_per_batch": 1}), curated, steps, ledger, at(60)
    )
    assert later.ready and sorted(later.consumed["turn_id"]) == ["s1", "s2"]


def test_shipped_recipes_load():
    recipes = load_recipes("assets/batches.yaml")
    grpo = recipes["grpo"]
    assert (grpo.group_size, grpo.groups_per_batch, grpo.exports) == (
        4,
        4,
        ["verl", "trl", "jsonl"],
    )
    assert {"dpo", "sft"} <= set(recipes)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"algorithm": "grpo", "group_size": 1}, "group_size"),
        ({"algorithm": "rloo", "group_size": 1}, "group_size"),
        ({"algorithm": "dpo", "min_reward_gap": 0}, "min_reward_gap"),
        ({"algorithm": "dpo", "min_reward_gap": float("inf")}, "min_reward_gap"),
        ({"algorithm": "grpo", "straggler_timeout_s": float("inf")}, "straggler_timeout_s"),
        ({"algorithm": "sft", "filters": {"min_reward": float("nan")}}, "filters.min_reward"),
    ],
)
def test_useless_recipes_are_refused_at_load_by_recipe_and_field(tmp_path, entry, field):
    path = tmp_path / "batches.yaml"
    path.write_text(yaml.safe_dump({"recipes": [{"name": "grpo"}, {"name": "useless", **entry}]}))
    with pytest.raises(ValidationError, match=f"recipe 'useless': {field}: "):
        load_recipes(path)


@pytest.mark.parametrize(
    "entry",
    [
        {"groups_per_batch": 0},
        {"straggler_timeout_s": -1},
        {"credit_assignment": {"method": "discounted", "gamma": 1.5}},
        {"credit_assignment": {"method": "discounted", "gamma": 0}},
        {"credit_assignment": {"method": "discounted", "gama": 0.9}},
        {"filters": {"min_quality": 1.5}},
        {"filters": {"max_policy_lag": -1}},
    ],
)
def test_senseless_values_are_refused(entry):
    with pytest.raises(ValidationError):
        Recipe.model_validate({"name": "grpo", **entry})


def test_algorithms_without_groups_take_groups_of_one():
    for algorithm in ("ppo", "reinforce_pp", "sft", "dpo"):
        Recipe.model_validate({"name": algorithm, "algorithm": algorithm, "group_size": 1})
    Recipe.model_validate({"name": "ppo", "algorithm": "ppo", "min_reward_gap": 0})


def test_a_batch_planned_under_a_recipe_refused_today_re_plans_under_it():
    pinned = {**_recipe().model_dump(mode="json", exclude={"exports"}), "group_size": 1}
    assert Recipe.model_validate(pinned, context=PINNED).group_size == 1
    pins = Pins(curated_steps=0, batch_ledger=-1, planned_at=at(0), recipe=pinned)
    assert pinned_recipe(_recipe(), pins).group_size == 1


def test_stale_trajectories_are_measured_against_the_newest_policy_seen():
    curated, steps = _curated({"a": [1, 0], "b": [1, 0]})
    curated = curated.with_columns(
        pl.when(pl.col("group_id") == "a").then(1).otherwise(6).alias("policy_version")
    )
    recipe = _recipe(groups_per_batch=1, filters={"max_policy_lag": 2})
    first = plan_batch(recipe, curated, steps, None, at(200))
    assert set(first.rows["group_id"]) == {"b"} and _reasons(first)["a:0"] == "stale"
    second = plan_batch(recipe, curated, steps, first.ledger_rows("grpo", at(200)), at(200))
    assert _reasons(second) == {"a:0": "stale", "a:1": "stale"}
    assert plan_batch(recipe, curated, steps, None, at(200), latest_policy_version=2).rows[
        "group_id"
    ].unique().to_list() == ["a"]


def _same_batch_without(earlier, recipe: Recipe, curated, steps, ledger, now, **kw):
    """The plan leaving out the ``earlier`` plans' final drops and starting at the last one's
    ``open_since_next``, after checking it picks what reading everything picks."""
    retired = pl.concat([plan.final for plan in earlier])
    full = plan_batch(recipe, curated, steps, ledger, now, **kw)
    lean = plan_batch(recipe, curated, steps, ledger, now, retired=retired,
                      open_since=earlier[-1].open_since_next, **kw)  # fmt: skip
    assert lean.rows.equals(full.rows) and lean.consumed.equals(full.consumed)
    assert lean.ready == full.ready
    kept = full.dropped.join(retired.select("turn_id"), on="turn_id", how="anti")
    assert lean.dropped.equals(kept)
    return lean


def test_final_drops_leave_every_later_batch_unchanged():
    """Time passes, the policy moves on and a batch is consumed between the plans: leaving the
    first plan's final drops out changes nothing. An overflowing zero-variance group is not
    final: once a member goes stale, the next one moves up and the group is trainable."""
    curated, steps = _curated({"flat": [1, 1], "over": [1, 1, 0], "ok": [0, 1], "late": [1, 0],
                               "s": [1]})  # fmt: skip
    curated = curated.with_columns(
        pl.when(pl.col("trajectory_id") == "over:0").then(1).otherwise(3).alias("policy_version"),
        (pl.col("trajectory_id") != "late:1").alias("trainable"),
    )
    recipe = _recipe(groups_per_batch=1, filters={"max_policy_lag": 2})
    first = plan_batch(recipe, curated, steps, None, at(200))
    assert set(first.rows["group_id"]) == {"ok"}
    assert set(first.final["trajectory_id"]) == {"flat:0", "flat:1", "late:0", "late:1"}
    assert _reasons(first)["over:0"] == "zero_variance"
    assert _reasons(first)["late:0"] == "group_short"  # both rollouts landed, one untrainable
    assert first.open_since_next == at(1)  # over:0 starts first in play: flat:* are retired

    ledger = first.ledger_rows("grpo", at(200))
    second = _same_batch_without([first], recipe, curated, steps, ledger, at(5000),
                                 latest_policy_version=4)  # fmt: skip
    assert set(second.rows["trajectory_id"]) == {"over:1", "over:2"}
    assert _reasons(second) == {"over:0": "stale", "s:0": "straggler_dropped"}
    assert set(second.final["trajectory_id"]) == {"s:0", "over:0"}
    assert second.open_since_next == at(
        14.001
    )  # none in play once reserved: after the newest start
    ledger = pl.concat([ledger, second.ledger_rows("grpo", at(5000))])
    third = _same_batch_without([first, second], recipe, curated, steps, ledger, at(9000),
                                latest_policy_version=4)  # fmt: skip
    assert third.rows.is_empty() and third.dropped.is_empty()
    assert third.open_since_next == at(14.001)  # nothing left in play: after the newest start


def test_groups_waiting_or_queued_are_not_final():
    curated, steps = _curated({"a": [1, 0], "b": [0, 1], "w": [1]})
    plan = plan_batch(_recipe(groups_per_batch=1), curated, steps, None, at(200))
    assert set(_reasons(plan).values()) == {"next_batch", "waiting_for_group"}
    assert final_drops(_recipe(groups_per_batch=1), plan.dropped, NO_TRAJECTORIES).is_empty()


def test_dpo_retires_single_steps_but_never_unpaired_ones():
    """An unpaired step can pair with a group mate once the best and worst are consumed."""
    prompt = [*SYSTEM, 1, 2]
    rows = [turn(name, prompt, [i + 5], trajectory_id=f"t{i}", group_id="g", start=i)
            for i, name in enumerate(["best", "high", "low", "worst", "skip"])]  # fmt: skip
    values = {"t0": 1.0, "t1": 0.8, "t2": 0.2, "t3": 0.0, "t4": 0.5}
    landed = rewards(*[{"trajectory_id": t, "value": v} for t, v in values.items()])
    steps = extract_steps(turns(*rows), None, events(*[event(t) for t in values]), now=at(50)).steps
    curated = (
        curate_steps(
            score_steps(reward_steps(steps, landed, None, RewardConfig()), steps, QualityConfig()),
            None,
        )
        .collect()
        .with_columns((pl.col("turn_id") != "skip").alias("trainable"))
    )
    recipe = load_recipes("assets/batches.yaml")["dpo"].model_copy(update={"groups_per_batch": 1})
    first = plan_batch(recipe, curated, steps, None, at(60))
    assert first.final.select("turn_id", "reason").rows() == [("skip", "untrainable")]
    ledger = first.ledger_rows("dpo", at(60))
    second = _same_batch_without([first], recipe, curated, steps, ledger, at(60))
    assert (second.rows["turn_id"].item(), second.rows["rejected_turn_id"].item()) == (
        "high",
        "low",
    )


@pytest.mark.parametrize("seed", range(40))
def test_plans_from_retirements_and_open_since_equal_full_plans_on_random_backlogs(seed):
    """Random groups (flat ones common), untrainable steps, policy lag, straggler policies and
    batch sizes; time passes, the policy moves on and ready batches are consumed."""
    rng = random.Random(seed)
    groups = {f"g{g}": [rng.choice([0.0, 0.5, 1.0, 1.0]) for _ in range(rng.randint(1, 5))]
              for g in range(8)}  # fmt: skip
    curated, steps = _curated(groups, steps=rng.randint(1, 2))
    curated = curated.with_columns(
        pl.Series("trainable", [rng.random() > 0.05 for _ in range(curated.height)]),
        pl.Series("policy_version", [rng.choice([1, 2, 3, 3]) for _ in range(curated.height)],
                  dtype=pl.Int64),
    )  # fmt: skip
    recipe = _recipe(group_size=3, groups_per_batch=rng.randint(1, 2),
                     straggler_policy=rng.choice(["emit", "drop"]),
                     filters={"max_policy_lag": 1})  # fmt: skip
    ledger, earlier = None, []
    for now, latest in [(100, 3), (700, 3), (2000, 4), (5000, 5)]:
        if earlier:
            plan = _same_batch_without(earlier, recipe, curated, steps, ledger, at(now),
                                       latest_policy_version=latest)  # fmt: skip
        else:
            plan = plan_batch(recipe, curated, steps, ledger, at(now), latest_policy_version=latest)
        earlier.append(plan)
        if plan.ready:
            consumed = plan.ledger_rows("grpo", at(now))
            ledger = consumed if ledger is None else pl.concat([ledger, consumed])


def _alike(plan, alone) -> None:
    """Two plans of one batch agree on everything they hold."""
    assert plan.rows.equals(alone.rows) and plan.consumed.equals(alone.consumed)
    assert plan.dropped.equals(alone.dropped) and plan.final.equals(alone.final)
    assert (plan.ready, plan.open_since_next) == (alone.ready, alone.open_since_next)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
@pytest.mark.parametrize("seed", range(20))
def test_batches_planned_together_equal_each_planned_alone_or_in_turn(seed, algorithm):
    """A release plans its batches from one read: the batch at each position is the one a plan
    for that position alone gives (a re-plan from its pins), and the one planning in turn gives,
    each after the batches before it are consumed."""
    rng = random.Random(seed)
    groups = {f"g{g}": [rng.choice([0.0, 0.5, 1.0, 1.0]) for _ in range(rng.randint(1, 5))]
              for g in range(10)}  # fmt: skip
    curated, steps = _curated(groups, steps=rng.randint(1, 2))
    curated = curated.with_columns(
        pl.Series("trainable", [rng.random() > 0.05 for _ in range(curated.height)])
    )
    recipe = _recipe(group_size=3, groups_per_batch=rng.randint(1, 2),
                     straggler_policy=rng.choice(["emit", "drop"]))  # fmt: skip
    if algorithm != "grpo":  # whole trajectories, no groups
        fields = {"algorithm": algorithm, "group_size": 1, "groups_per_batch": rng.randint(2, 5)}
        recipe = Recipe.model_validate({"name": algorithm, **fields})
    now = at(rng.choice([100, 5000]))
    ids = [f"{algorithm}-{n:06d}" for n in range(1, 5)]
    together = plan_batches(recipe, curated, steps, None, now, batch_ids=ids)
    ledger = None
    assert [plan.ready for plan in together][:-1] == [True] * (len(together) - 1)
    assert len(together) == len(ids) or not together[-1].ready
    for position, (batch_id, plan) in enumerate(zip(ids, together, strict=False)):
        _alike(plan, plan_batches(recipe, curated, steps, None, now, batch_ids=[batch_id],
                                  first=position)[0])  # fmt: skip
        in_turn = plan_batch(recipe, curated, steps, ledger, now, batch_id=batch_id)
        assert in_turn.ready == plan.ready
        if not plan.ready:
            break
        assert in_turn.rows.equals(plan.rows)
        consumed = plan.ledger_rows(algorithm, now)
        ledger = consumed if ledger is None else pl.concat([ledger, consumed])


def test_dpo_pairs_planned_together_equal_each_planned_alone():
    """One plan pairs each state once: its second pair (s1/s2, once s0/s3 are consumed) waits
    for the next plan, as it would planning in turn."""
    steps, curated = _two_states_and_leftovers()
    recipe = load_recipes("assets/batches.yaml")["dpo"].model_copy(update={"groups_per_batch": 1})
    ids = ["dpo-000001", "dpo-000002", "dpo-000003", "dpo-000004"]
    together = plan_batches(recipe, curated, steps, None, at(60), batch_ids=ids)
    assert [plan.ready for plan in together] == [True, True, False]
    assert [sorted(plan.consumed["turn_id"]) for plan in together[:2]] == [
        ["s0", "s3"],
        ["n0", "n3"],
    ]
    assert dict(together[1].dropped.select("turn_id", "reason").iter_rows())["s1"] == "next_batch"
    for position, plan in enumerate(together):
        alone = plan_batches(recipe, curated, steps, None, at(60), batch_ids=[ids[position]],
                             first=position)  # fmt: skip
        _alike(plan, alone[0])
