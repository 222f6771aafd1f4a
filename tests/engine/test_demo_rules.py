"""The demo's pure parts: task format, safe calculator, reward rule, planning, summary."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from claw_pipelines.demo import (
    Outcome,
    Rollout,
    calculator,
    count_batches,
    plan_rollouts,
    reward,
    summarize,
    summary_table,
)
from claw_pipelines.demo_workspace import generate_workspaces, handbook
from claw_pipelines.engine.tasks import (
    Task,
    evaluate,
    final_answer_text,
    generate_tasks,
    parse_final_answer,
    parse_question,
)
from claw_pipelines.engine.tokenizer import encode
from claw_pipelines.lake import Lake


def test_tasks_round_trip_through_the_question_format() -> None:
    tasks = generate_tasks(50, seed=3)
    assert tasks == generate_tasks(50, seed=3)
    assert tasks != generate_tasks(50, seed=4)
    for task in tasks:
        assert parse_question(f"Please answer. {task.question}") == task
        assert parse_final_answer(final_answer_text(task.answer)) == task.answer
    assert Task(37, "-", 45).answer == -8
    assert Task(6, "*", 7).task_id == "arith:6*7"


@pytest.mark.parametrize(
    ("arguments", "result"),
    [
        ('{"expression": "37 + 45"}', "82"),
        ('{"expression": "(1 + 2) * -3"}', "-9"),
        ('{"expression": "7 / 2"}', "3.5"),
        ('{"expression": "8 / 2"}', "4"),
    ],
)
def test_calculator(arguments: str, result: str) -> None:
    assert calculator(arguments) == result


@pytest.mark.parametrize(
    "arguments",
    [
        '{"expression": "1 / 0"}',
        '{"expression": "__import__(\\"os\\").getcwd()"}',
        '{"expression": "2 ** 100000"}',
        '{"expression": "x + 1"}',
        '{"expression": "1 +"}',
        '{"expr": "1"}',
        "not json",
        '{"expression": "' + "1+" * 200 + '1"}',
    ],
)
def test_calculator_refuses_anything_else(arguments: str) -> None:
    assert calculator(arguments).startswith("error:")


def test_evaluate_never_evals() -> None:
    with pytest.raises(ValueError):
        evaluate("().__class__")


def test_reward_rule() -> None:
    assert reward("37 + 45 = 82. The answer is 82.", 82) == 1.0
    assert reward("The answer is 80. Hmm, no: the answer is 82.", 82) == 1.0
    assert reward("The answer is 81.", 82) == 0.0
    assert reward("82", 82) == 0.0
    assert reward(None, 82) == 0.0


def test_plan_rollouts_groups_by_task() -> None:
    ids = (f"id-{i}" for i in itertools.count())
    plan = plan_rollouts(generate_tasks(3, seed=1), 4, lambda: next(ids))
    assert len(plan) == 12
    assert len({r.trajectory_id for r in plan}) == 12
    tasks_by_group: dict[str, set[Task]] = {}
    for rollout in plan:
        tasks_by_group.setdefault(rollout.group_id, set()).add(rollout.task)
    assert len(tasks_by_group) == 3
    assert all(len(tasks) == 1 for tasks in tasks_by_group.values())
    assert plan[0].claw_metadata()["ground_truth"] == str(plan[0].task.answer)


def test_summary() -> None:
    task = Task(1, "+", 1)
    outcomes = [
        Outcome(Rollout(task, "g1", "t1"), 2, 1.0),
        Outcome(Rollout(task, "g1", "t2"), 1, 0.0),
        Outcome(Rollout(task, "g2", "t3"), 1, 1.0),
        Outcome(Rollout(task, "g2", "t4"), 0, None, "APIConnectionError: down"),
    ]
    summary = summarize(outcomes, batches=None)
    assert (summary.trajectories, summary.errors, summary.turns) == (4, 1, 4)
    assert summary.mean_reward == pytest.approx(2 / 3)
    assert (summary.mixed_groups, summary.groups) == (1, 2)
    console = Console(record=True, width=120)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "not yet" in text
    assert "1 / 2" in text


def test_count_batches(tmp_path: Path) -> None:
    lake = Lake(str(tmp_path / "lake"))
    assert count_batches(lake) is None
    lake.append("batches/grpo", pa.table({"batch_id": ["a", "a", "b"], "step_index": [0, 1, 0]}))
    assert count_batches(lake) == 2


def test_long_session_workspaces_are_reproducible_and_answer_their_tools() -> None:
    workspaces = generate_workspaces(3, seed=5, files=7)
    assert workspaces == generate_workspaces(3, seed=5, files=7)
    assert workspaces != generate_workspaces(3, seed=6, files=7)
    workspace = workspaces[0]
    names = workspace.run_tool("list_files", '{"path": "."}').splitlines()
    assert names == list(workspace.files) and len(names) == 7
    read = [workspace.run_tool("read_file", json.dumps({"path": name})) for name in names]
    assert sum(len(text.splitlines()) for text in read) == workspace.answer
    assert workspace.run_tool("read_file", '{"path": "nope.md"}').startswith("error:")
    assert workspace.run_tool("rm", '{"path": "."}').startswith("error:")
    assert workspace.run_tool("read_file", "not json").startswith("error:")


@pytest.mark.parametrize("tokens", [500, 27_000])
def test_the_long_system_prompt_is_as_long_as_asked_and_asks_nothing(tokens: int) -> None:
    text = handbook(tokens)
    assert tokens <= len(encode(text)) < tokens + 150  # one section more at most
    assert parse_question(text) is None
