"""Incremental step extraction: order, dedupe, closing, reopening, prefix checks, inference."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pytest
from transform_rows import SYSTEM, at, chain, event, events, turn, turns

from claw_pipelines.derived_schemas import EXTRACTED_STEPS, OPEN_STATE, conform
from claw_pipelines.transforms import extract_steps


def _run(new, before: Extracted | None = None, evts=None, now=30.0, **kwargs) -> Extracted:
    """A run on the state a run ``before`` left, stored as ``steps_refresh`` stores it."""
    state = None if before is None else before.state
    result = extract_steps(new, state, evts, now=at(now), idle_timeout_s=600, **kwargs)
    tails = [result.new_tails] if before is None else [before.tails, result.new_tails]
    return Extracted(result.steps, result.open_turns, result.new_tails, pl.concat(tails))


@dataclass(frozen=True)
class Extracted:
    """An extraction, and the state the steps asset keeps after it: its open turns replace
    ``steps_open``, its new tails are appended to the ``steps_tails`` log."""

    steps: pl.DataFrame
    open_turns: pl.DataFrame
    new_tails: pl.DataFrame
    tails: pl.DataFrame
    """The log: every run's new tails so far."""

    @property
    def state(self) -> pl.DataFrame:
        """What the next run reads: the open turns and the tails log."""
        return pl.concat([self.open_turns, self.tails])


def test_out_of_order_and_duplicate_turns_become_ordered_unique_steps():
    rows = chain("A", 3, group_id="g")
    shuffled = turns(rows[2], rows[0], rows[1], rows[0])
    result = _run(shuffled, evts=events(event("A")), source_version=7)
    steps = result.steps
    assert steps["step_id"].to_list() == ["A-0", "A-1", "A-2"]
    assert steps["step_index"].to_list() == [0, 1, 2]
    assert steps["is_last"].to_list() == [False, False, True]
    assert steps["prefix_consistent"].all()
    assert steps["group_id"].unique().to_list() == ["g"]
    assert steps["close_reason"].unique().to_list() == ["completed"]
    assert steps["source_version"].unique().to_list() == [7]
    assert steps["shared_prefix_tokens"].to_list() == [0, 23, 27]
    conform(steps, EXTRACTED_STEPS)
    conform(result.open_turns, OPEN_STATE)
    conform(result.new_tails, OPEN_STATE)
    assert result.open_turns.height == 0 and result.new_tails["trajectory_id"].to_list() == ["A"]


def test_open_trajectory_is_carried_until_its_event_then_emitted_once():
    rows = chain("A", 3)
    first = _run(turns(rows[0], rows[2]))
    assert first.steps.height == 0
    assert first.open_turns["turn_id"].sort().to_list() == ["A-0", "A-2"]
    second = _run(turns(rows[1], rows[0]), first, events(event("A", "aborted")))
    assert second.steps["step_id"].to_list() == ["A-0", "A-1", "A-2"]
    assert second.steps["close_reason"].unique().to_list() == ["aborted"]
    assert second.open_turns.height == 0
    third = _run(None, second, events(event("A")))
    assert third.steps.height == 0


def test_a_failed_call_without_tokens_waits_in_the_state_and_is_counted_on_its_steps():
    """A call the engine failed before producing tokens is no step, but the steps of its
    trajectory say it happened (``failed_calls``), also when it landed in an earlier run."""
    rows = chain("A", 2)
    failed = {**rows[1], "turn_id": "A-failed", "status": "error", "response_token_ids": None,
              "response_logprobs": None, "started_at": at(5), "ended_at": at(6)}  # fmt: skip
    first = _run(turns(rows[0], failed, *chain("B", 1)))
    assert first.steps.height == 0
    assert first.open_turns["turn_id"].sort().to_list() == ["A-0", "A-failed", "B-0"]
    second = _run(turns(rows[1]), first, events(event("A"), event("B")))
    counts = dict(second.steps.select("step_id", "failed_calls").iter_rows())
    assert counts == {"A-0": 1, "A-1": 1, "B-0": 0}
    assert second.open_turns.height == 0
    only_failed = _run(turns({**failed, "trajectory_id": "C", "turn_id": "C-0"}), now=1000)
    assert only_failed.steps.height == 0 and only_failed.open_turns.height == 0


def test_idle_trajectory_closes_by_timeout():
    state = _run(turns(*chain("A", 2)))
    assert _run(None, state, now=300).steps.height == 0
    closed = _run(None, state, now=1000).steps
    assert closed["close_reason"].unique().to_list() == ["timeout"]


def test_a_log_of_tails_continues_from_the_latest_emission():
    """A tails log keeps a row per emission of a trajectory; the highest step_index is current,
    so a second late turn follows the first one, not the original end."""
    rows = chain("A", 4)
    first = _run(turns(*rows[:2]), evts=events(event("A")))
    second = _run(turns(rows[2]), first, now=60, landed=first.steps)
    assert second.tails["step_index"].to_list() == [1, 2]
    emitted = pl.concat([first.steps, second.steps])
    third = _run(turns(rows[3], rows[1]), second, now=90, landed=emitted)
    assert third.steps["step_id"].to_list() == ["A-3"]
    assert third.steps["step_index"].to_list() == [3]
    assert third.steps["prefix_consistent"].all()


def test_reopened_trajectory_appends_without_duplicating():
    rows = chain("A", 4)
    first = _run(turns(*rows[:2]), evts=events(event("A")))
    assert first.steps["step_index"].to_list() == [0, 1]
    assert first.state.height == 1 and first.state["prompt_token_ids"].is_null().all()
    late = _run(turns(rows[2], rows[1], rows[3]), first, now=60, landed=first.steps)
    assert late.steps["step_id"].to_list() == ["A-2", "A-3"]
    assert late.steps["step_index"].to_list() == [2, 3]
    assert late.steps["reopened"].all()
    assert late.steps["prefix_consistent"].all()
    assert late.steps["shared_prefix_tokens"][0] == first.steps["shared_prefix_tokens"][1] + 4
    assert late.new_tails["emitted_turn_ids"].to_list() == [["A-0", "A-1", "A-2", "A-3"]]
    again = _run(turns(rows[0]), late, now=90)
    assert again.steps.height == 0


def test_a_closed_tail_survives_runs_that_do_not_touch_it():
    rows = chain("A", 3)
    first = _run(turns(*rows[:2]), evts=events(event("A")))
    other = _run(turns(*chain("B", 1)), first, events(event("B")), now=40)
    assert other.new_tails["trajectory_id"].to_list() == ["B"]  # A's is not rewritten
    emitted = pl.concat([first.steps, other.steps])
    late = _run(turns(rows[2]), other, now=60, landed=emitted)
    assert late.steps["step_index"].to_list() == [2]
    assert late.steps["reopened"].all() and late.steps["prefix_consistent"].all()


def test_a_late_turn_is_checked_against_the_late_turn_before_it_not_the_tail():
    rows = chain("A", 4)
    first = _run(turns(*rows[:2]), evts=events(event("A")))
    blind = {**rows[2], "prompt_token_ids": None}
    late = _run(turns(blind, rows[3]), first, now=60, landed=first.steps)
    assert late.steps["step_index"].to_list() == [2, 3]
    assert late.steps["prefix_break_reason"].to_list() == ["missing_tokens", None]
    assert late.steps["prefix_consistent"].to_list() == [False, True]


def test_event_before_turns_emits_turns_on_arrival():
    first = _run(None, evts=events(event("A")))
    assert first.new_tails["step_index"].to_list() == [-1]
    second = _run(turns(*chain("A", 2)), first)
    assert second.steps["step_index"].to_list() == [0, 1]
    assert not second.steps["reopened"].any()


def _pair(second_prompt, first_prompt=None, first_response=None, **fields):
    first_prompt = first_prompt or [*SYSTEM, 1, 2]
    first_response = first_response or [3, 4, 5]
    rows = [
        turn("s0", first_prompt, first_response, trajectory_id="T"),
        turn("s1", second_prompt, [9], start=5, trajectory_id="T", **fields),
    ]
    steps = _run(turns(*rows), evts=events(event("T"))).steps
    return steps.filter(pl.col("step_id") == "s1").row(0, named=True)


@pytest.mark.parametrize(
    ("second_prompt", "fields", "reason", "shared"),
    [
        ([*SYSTEM, 1, 2, 3, 4, 5, 6], {}, None, 25),
        ([*SYSTEM, 1, 2, 7, 8, 6], {}, "template_change", 22),
        ([*SYSTEM, 1, 2, 3, 8, 6], {}, "retokenized", 23),
        ([*SYSTEM, 1, 2, 7, 8, 6], {"token_source": "retokenized"}, "retokenized", 22),
        ([*SYSTEM, 1, 7, 3, 4, 5, 6], {}, "context_edit", 21),
        ([*SYSTEM, 1, 2, 3], {}, "context_edit", 23),
        (None, {}, "missing_tokens", 0),
    ],
)
def test_prefix_break_reasons(second_prompt, fields, reason, shared):
    step = _pair(second_prompt, **fields)
    assert step["prefix_break_reason"] == reason
    assert step["prefix_consistent"] == (reason is None)
    assert step["shared_prefix_tokens"] == shared


def test_identity_less_turns_are_inferred_by_prefix_across_runs():
    a = chain(None, 3, prefix="a", base=10)
    b = chain(None, 2, prefix="b", base=20, start=1)
    retry = turn("a-1-retry", a[1]["prompt_token_ids"], [77], start=12)
    first = _run(turns(a[0], b[1], a[1], b[0], retry))
    state = first.open_turns
    inferred = dict(zip(state["turn_id"], state["trajectory_id"], strict=True))
    assert inferred["a-0"] == inferred["a-1"] == "inferred-a-0"
    assert inferred["b-0"] == inferred["b-1"] == "inferred-b-0"
    assert inferred["a-1-retry"] == "inferred-a-1-retry"
    second = _run(turns(a[2]), first, now=5000)
    by_trajectory = second.steps.group_by("trajectory_id").agg(pl.col("step_id").sort())
    got = dict(by_trajectory.iter_rows())
    assert got["inferred-a-0"] == ["a-0", "a-1", "a-2"]
    assert got["inferred-b-0"] == ["b-0", "b-1"]
    assert second.steps["trajectory_inferred"].all()
    assert second.steps.filter(pl.col("trajectory_id") == "inferred-a-0")["prefix_consistent"].all()


def test_late_identity_less_turn_continues_a_closed_inferred_trajectory():
    a = chain(None, 3, prefix="a", base=10)
    closed = _run(turns(*a[:2]), now=5000)
    assert closed.steps.height == 2
    late = _run(turns(a[2]), closed, now=5010, landed=closed.steps)
    assert late.steps.select("trajectory_id", "step_index", "reopened").row(0) == (
        "inferred-a-0",
        2,
        True,
    )


def _rollout(name, responses, *, start):
    """An identity-less agent answering ``responses``, one turn each, 10 s apart. Every agent
    gets the same prompt and tool output, so agents that answer alike send identical turns."""
    rows, prompt = [], [*SYSTEM, 1]
    for i, response in enumerate(responses):
        rows.append(turn(f"{name}-{i}", prompt, response, start=start + 10 * i))
        prompt = [*prompt, *response, 7, 8]
    return rows


def _trajectories(*steps):
    frame = pl.concat(steps).sort("step_index")
    return dict(frame.group_by("trajectory_id", maintain_order=True).agg("step_id").iter_rows())


def test_identical_turns_of_several_agents_are_continued_once_each():
    answers = [[[5, 6], [30, 31], [50]], [[5, 6], [30, 31], [51]], [[5, 6], [32], [52]],
               [[5, 6], [33], [53]]]  # fmt: skip
    rows = [row for i, a in enumerate(answers) for row in _rollout(f"r{i}", a, start=i)]
    steps = _run(turns(*rows), now=5000).steps
    assert _trajectories(steps) == {
        f"inferred-r{i}-0": [f"r{i}-0", f"r{i}-1", f"r{i}-2"] for i in range(len(answers))
    }
    assert steps["prefix_consistent"].all()


@pytest.mark.parametrize("tail", ["open", "closed"])
def test_a_known_tail_and_an_identical_new_turn_are_continued_once_each(tail):
    r0, r1 = _rollout("r0", [[5, 6], [30]], start=0), _rollout("r1", [[5, 6], [31]], start=1)
    first = _run(turns(r0[0]), now=30 if tail == "open" else 5000)
    second = _run(turns(r1[0], r0[1], r1[1]), first, now=5010, landed=first.steps)
    assert _trajectories(first.steps, second.steps) == {
        "inferred-r0-0": ["r0-0", "r0-1"],
        "inferred-r1-0": ["r1-0", "r1-1"],
    }


def test_empty_inputs_give_empty_outputs():
    result = _run(None)
    assert result.steps.height == 0 and result.state.height == 0
    assert result.steps.columns == EXTRACTED_STEPS.names


def test_group_comes_from_a_sibling_turn_or_the_completion_event():
    rows = chain("A", 2)
    rows[1]["group_id"] = "from-turn"
    steps = _run(turns(*rows, *chain("B", 1, base=50)), evts=events(
        event("A"), event("B", group_id="from-event"))).steps  # fmt: skip
    assert dict(steps.select("step_id", "group_id").iter_rows()) == {
        "A-0": "from-turn",
        "A-1": "from-turn",
        "B-0": "from-event",
    }
