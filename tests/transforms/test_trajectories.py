"""Trajectory summaries from emitted steps and events."""

from __future__ import annotations

from transform_rows import SYSTEM, at, chain, event, events, turn, turns

from claw_pipelines.derived_schemas import TRAJECTORIES, conform
from claw_pipelines.transforms import extract_steps, summarize_trajectories


def test_summary_counts_tokens_outcome_and_prefix_savings():
    rows = [*chain("A", 3, group_id="g", policy_version=2), *chain("B", 1, group_id="g")]
    rows.append(turn("C-0", [*SYSTEM, 5], [6, 7], trajectory_id="C", start=3))
    rows.append(turn("C-1", [*SYSTEM, 9, 9], [8], trajectory_id="C", start=4, policy_version=3))
    evts = events(
        event("A", reward=0.5, when=40),
        event("A", reward=1.0, when=50),
        event("B", "aborted"),
    )
    steps = extract_steps(turns(*rows), None, evts, now=at(2000), idle_timeout_s=600).steps
    summary = summarize_trajectories(steps, evts).collect()
    conform(summary, TRAJECTORIES)
    a, b, c = summary.rows(named=True)
    assert (a["num_steps"], a["outcome"], a["complete"], a["outcome_reward"]) == (
        3,
        "completed",
        True,
        1.0,
    )
    assert a["prompt_tokens"] == 21 + 25 + 29 and a["response_tokens"] == 6
    assert a["shared_prefix_tokens_saved"] == 23 + 27
    assert a["duration_s"] == 21.0 and a["policy_versions"] == [2]
    assert (b["outcome"], b["complete"], b["outcome_reward"]) == ("aborted", False, None)
    assert (c["outcome"], c["prefix_consistent"], c["policy_versions"]) == (
        "timeout",
        False,
        [1, 3],
    )
    assert c["shared_prefix_tokens_saved"] == 20
