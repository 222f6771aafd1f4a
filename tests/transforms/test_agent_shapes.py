"""Step extraction on the conversation shapes real agents send (``agent_shapes``)."""

from __future__ import annotations

import polars as pl
from agent_shapes import (
    SHELL,
    call,
    calls,
    claude_code_session,
    codex_session,
    result,
    says,
    system,
    trailing_context_session,
    user,
)
from transform_rows import at, event, events, turns

from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batching.planner import plan_batch
from claw_pipelines.derived_schemas import EXTRACTED_STEPS, TRAJECTORIES, conform
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
    summarize_trajectories,
)
from claw_pipelines.transforms.prefixes import full_sequence
from claw_pipelines.transforms.reward_rules import RewardConfig


def _steps(*rows, evts=None, now=5000.0) -> pl.DataFrame:
    result = extract_steps(turns(*rows), None, evts, now=at(now), idle_timeout_s=600)
    return result.steps.sort("trajectory_id", "step_index")


def _by_trajectory(steps: pl.DataFrame) -> dict[str, list[str]]:
    return dict(steps.group_by("trajectory_id").agg(pl.col("turn_id").sort()).iter_rows())


def _shared_with_previous(rows: list[dict]) -> list[int]:
    """The tokens each call's prompt shares with the previous call's prompt + response."""
    frame = turns(*rows).select(
        "prompt_token_ids", full_sequence("prompt_token_ids", "response_token_ids").alias("full")
    )
    shared = [0]
    for before, now in zip(frame["full"].to_list(), frame["prompt_token_ids"].to_list()[1:],
                           strict=False):  # fmt: skip
        n = next((i for i, (a, b) in enumerate(zip(before, now, strict=False)) if a != b), None)
        shared.append(min(len(before), len(now)) if n is None else n)
    return shared


def test_a_trailing_context_message_moved_on_every_call_is_a_tail_edit():
    """OpenClaw: one trajectory; every later step is a tail_edit that keeps nearly all of the
    previous prompt, also when the context message's text changed."""
    rows = trailing_context_session("oc", start=at(0), trajectory_id="oc-1")
    steps = _steps(*rows, evts=events(event("oc-1")))
    assert _by_trajectory(steps) == {"oc-1": [r["turn_id"] for r in rows]}
    assert steps["prefix_break_reason"].to_list() == [None, "tail_edit", "tail_edit", "tail_edit"]
    assert not steps["prefix_consistent"][1:].any()
    shared = steps["shared_prefix_tokens"].to_list()
    assert shared == _shared_with_previous(rows)
    prompts = steps["prompt_len"].to_list()
    assert all(s > 0.8 * p for s, p in zip(shared[1:], prompts, strict=False))
    assert steps["parent_trajectory_id"].is_null().all()
    conform(steps, EXTRACTED_STEPS)


def test_identity_less_trailing_context_sessions_are_inferred_one_trajectory_each():
    """Two OpenClaw sessions without identity, same system prompt, at the same time: each is
    one inferred trajectory, linked through its tail edits."""
    a = trailing_context_session("a", start=at(0))
    b = trailing_context_session("b", start=at(1), task="List the photos.", listing="cat.png")
    steps = _steps(*a, *b)
    assert _by_trajectory(steps) == {
        "inferred-a-0": [r["turn_id"] for r in a],
        "inferred-b-0": [r["turn_id"] for r in b],
    }
    assert steps["trajectory_inferred"].all()
    assert steps.filter(pl.col("step_index") > 0)["prefix_break_reason"].unique().to_list() == [
        "tail_edit"
    ]


def test_identical_trailing_context_rollouts_are_continued_once_each():
    """Rollouts of one task whose first calls are identical: each first call is continued by
    one rollout's tail-edited second call (GRPO groups of identity-less agents)."""
    first = trailing_context_session("r0", start=at(0))[:2]
    other = trailing_context_session("r1", start=at(1), listing="todo.txt")[:2]
    steps = _steps(*first, *other)
    assert sorted(_by_trajectory(steps).values()) == [["r0-0", "r0-1"], ["r1-0", "r1-1"]]


def test_side_calls_of_a_claude_code_session_are_linked_side_trajectories():
    """The title call and the sub-agent carry the session's identity but not its conversation:
    each becomes a side trajectory of the session, without its group; the main conversation
    stays whole and prefix-consistent."""
    session = claude_code_session("cc", "cc-1", start=at(0), group_id="g")
    rows = [*session["title"], *session["main"], *session["helper"]]
    steps = _steps(*rows, evts=events(event("cc-1", group_id="g")))
    assert _by_trajectory(steps) == {
        "cc-1": ["cc-main-0", "cc-main-1"],
        "cc-1/side-cc-title": ["cc-title"],
        "cc-1/side-cc-helper-0": ["cc-helper-0", "cc-helper-1"],
    }
    assert steps["prefix_consistent"].all()
    sides = steps.filter(pl.col("trajectory_id") != "cc-1")
    assert sides["parent_trajectory_id"].unique().to_list() == ["cc-1"]
    assert sides["group_id"].is_null().all()
    main = steps.filter(pl.col("trajectory_id") == "cc-1")
    assert main["parent_trajectory_id"].is_null().all()
    assert main["group_id"].unique().to_list() == ["g"]
    assert steps.filter(pl.col("is_last"))["turn_id"].sort().to_list() == [
        "cc-helper-1", "cc-main-1", "cc-title"]  # fmt: skip
    assert set(steps["close_reason"]) == {"completed"}


def test_a_sub_agent_that_shares_the_system_prompt_is_split_off_where_it_forks():
    """Codex: the sub-agent starts from the main conversation's developer and environment
    messages and interleaves with it; the main conversation goes on past the fork, so the
    sub-agent is a side trajectory and both stay prefix-consistent."""
    session = codex_session("cx", "cx-1", start=at(0))
    steps = _steps(*session["main"], *session["helper"], evts=events(event("cx-1")))
    assert _by_trajectory(steps) == {
        "cx-1": ["cx-main-0", "cx-main-1", "cx-main-2"],
        "cx-1/side-cx-helper-0": ["cx-helper-0", "cx-helper-1"],
    }
    assert steps["prefix_consistent"].all()
    assert steps["step_index"].to_list() == [0, 1, 2, 0, 1]


def test_a_context_edit_that_keeps_the_system_prompt_stays_in_the_trajectory():
    """A trimmed history (older tool output dropped) is a break of the main trajectory, not a
    side call."""
    head = [system("You are a file assistant."), user("Tidy the folder.")]
    ls, rm = calls("c1", "shell", command="ls"), calls("c2", "shell", command="rm a.tmp")
    rows = [
        call("t-0", head, ls, start=at(0), tools=[SHELL], trajectory_id="t"),
        call("t-1", [*head, ls, result("c1", "a.tmp b.txt " * 40)], rm, start=at(10), tools=[SHELL],
             trajectory_id="t"),
        call("t-2", [*head, ls, result("c1", "(trimmed)"), rm, result("c2", "ok")],
             says("Done."), start=at(20), tools=[SHELL], trajectory_id="t"),
    ]  # fmt: skip
    steps = _steps(*rows, evts=events(event("t")))
    assert _by_trajectory(steps) == {"t": ["t-0", "t-1", "t-2"]}
    assert steps["prefix_break_reason"].to_list() == [None, None, "context_edit"]


def test_a_failed_call_is_no_step_and_the_next_is_checked_against_the_last_with_tokens():
    """The call after a failed one (no token IDs) is step 1, prefix-checked against step 0."""
    rows = trailing_context_session("f", start=at(0), trajectory_id="f")[:2]
    failed = {**rows[1], "turn_id": "f-failed", "status": "error", "error": "upstream 500",
              "prompt_token_ids": None, "response_token_ids": None, "response_logprobs": None,
              "started_at": at(5), "ended_at": at(6)}  # fmt: skip
    steps = _steps(rows[0], failed, rows[1], evts=events(event("f")))
    assert steps["turn_id"].to_list() == ["f-0", "f-1"]
    assert steps["step_index"].to_list() == [0, 1]
    assert steps["prefix_break_reason"].to_list() == [None, "tail_edit"]
    assert steps["shared_prefix_tokens"][1] == _shared_with_previous(rows)[1]


def test_a_step_without_tokens_stays_but_is_no_predecessor():
    """A successful call without token IDs is a step (missing_tokens); the step after it is
    checked against the step before it."""
    rows = trailing_context_session("n", start=at(0), trajectory_id="n")[:3]
    blind = {**rows[1], "token_source": "none", "prompt_token_ids": None,
             "response_token_ids": None, "response_logprobs": None}  # fmt: skip
    steps = _steps(rows[0], blind, rows[2], evts=events(event("n")))
    assert steps["prefix_break_reason"].to_list() == [None, "missing_tokens", "tail_edit"]
    assert steps["shared_prefix_tokens"][2] > 0


def test_side_trajectories_neither_join_nor_break_their_parents_group():
    """Two rollouts of a GRPO group, each with a title call under its identity: the group's
    batch has its two conversations; the side trajectories get no outcome reward (nor a
    group) and are dropped; rewards and summaries carry the parent link."""
    rows, evts = [], []
    for i, reward in enumerate([1.0, 0.0]):
        session = claude_code_session(f"r{i}", f"r{i}", start=at(i), group_id="g")
        rows += [*session["title"], *session["main"]]
        evts.append(event(f"r{i}", reward=reward, group_id="g"))
    extracted = extract_steps(turns(*rows), None, events(*evts), now=at(5000)).steps
    rewarded = reward_steps(extracted, None, events(*evts), RewardConfig())
    curated = curate_steps(score_steps(rewarded, extracted, QualityConfig()), None).collect()
    sides = curated.filter(pl.col("parent_trajectory_id").is_not_null())
    assert sides.height == 2 and not sides["reward_present"].any()
    assert curated.filter(pl.col("trajectory_id") == "r0")["outcome_reward"].unique().to_list() == [
        1.0]  # fmt: skip
    recipe = Recipe(name="grpo", group_size=2, groups_per_batch=1, filters={"min_quality": 0})
    plan = plan_batch(recipe, curated, extracted, None, at(6000))
    assert plan.ready
    assert plan.rows["trajectory_id"].unique().sort().to_list() == ["r0", "r1"]
    assert set(plan.rows["group_size"]) == {2}
    dropped = dict(plan.dropped.select("trajectory_id", "reason").unique().iter_rows())
    assert dropped == {"r0/side-r0-title": "no_reward", "r1/side-r1-title": "no_reward"}
    summary = summarize_trajectories(extracted, events(*evts)).collect()
    conform(summary, TRAJECTORIES)
    parents = dict(summary.select("trajectory_id", "parent_trajectory_id").iter_rows())
    assert parents == {"r0": None, "r1": None, "r0/side-r0-title": "r0",
                       "r1/side-r1-title": "r1"}  # fmt: skip


def test_late_turns_are_not_split_and_stay_in_the_main_trajectory():
    """A turn landing after its trajectory was emitted continues the emitted tail."""
    session = claude_code_session("late", "late-1", start=at(0))
    first = extract_steps(turns(*session["main"][:1]), None, events(event("late-1")),
                          now=at(100))  # fmt: skip
    state = pl.concat([first.open_turns, first.new_tails])  # steps_open and steps_tails
    late = extract_steps(turns(session["main"][1]), state, None, now=at(200),
                         landed=first.steps)  # fmt: skip
    assert late.steps.select("trajectory_id", "step_index", "reopened").row(0) == (
        "late-1", 1, True)  # fmt: skip
    assert late.steps["prefix_consistent"].all()


def test_a_reply_of_the_previous_call_alone_does_not_make_a_tail_edit():
    """A prompt that drops everything after the system prompt and then repeats the previous
    reply is a context edit: a tail edit drops at most a short trailing span."""
    head = [system("You are a file assistant."), user("Read the long report. " * 200)]
    ls = calls("c1", "shell", command="ls")
    rows = [
        call("e-0", head, ls, start=at(0), tools=[SHELL], trajectory_id="e"),
        call("e-1", [head[0], ls, result("c1", "x")], says("ok"), start=at(10), tools=[SHELL],
             trajectory_id="e"),
    ]  # fmt: skip
    steps = _steps(*rows, evts=events(event("e")))
    assert steps["prefix_break_reason"].to_list() == [None, "context_edit"]
