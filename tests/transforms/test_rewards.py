"""Reward joins, late rewards, source priority, credit assignment, rule rewards and the judge."""

from __future__ import annotations

import http.server
import json
import threading

import polars as pl
import pyarrow as pa
import pytest
from transform_rows import at, chain, event, events, registrations, rewards, turns

from claw_pipelines.derived_schemas import REWARDED_STEPS, TURN_COLUMNS, conform
from claw_pipelines.lake import Lake
from claw_pipelines.transforms import (
    CreditAssignment,
    affected_trajectories,
    extract_steps,
    reward_steps,
)
from claw_pipelines.transforms.reward_rules import (
    JudgeConfig,
    RewardConfig,
    RewardRule,
    openai_judge,
    reading_conversations,
    rule_rewards,
)
from claw_pipelines.transforms.rewards import rewards_aimed_at


def _steps(*trajectories: str, n: int = 3, group_id: str = "g", **fields) -> pl.DataFrame:
    rows = [
        row
        for i, t in enumerate(trajectories)
        for row in chain(t, n, group_id=group_id, base=100 * i, **fields)
    ]
    evts = events(*[event(t) for t in trajectories])
    return extract_steps(turns(*rows), None, evts, now=at(1000)).steps


def _rewards_by_step(frame: pl.LazyFrame) -> dict[str, tuple]:
    df = frame.collect()
    conform(df, REWARDED_STEPS)
    return {r["step_id"]: (r["reward"], r["reward_present"], r["reward_sources"]) for r in
            df.iter_rows(named=True)}  # fmt: skip


def test_late_reward_reaches_only_the_affected_trajectories():
    steps = _steps("A", "B")
    config = RewardConfig()
    before = _rewards_by_step(reward_steps(steps, None, None, config))
    assert before["A-2"] == (None, False, [])
    late = rewards({"trajectory_id": "A", "value": 1.0, "source": "env", "created_at": at(5000)})
    touched = affected_trajectories(None, late, None, steps)
    assert touched["trajectory_id"].to_list() == ["A"]
    affected = steps.join(touched, on="trajectory_id")
    after = _rewards_by_step(reward_steps(affected, late, None, config))
    assert set(after) == {"A-0", "A-1", "A-2"}
    assert after["A-2"] == (1.0, True, ["env"]) and after["A-0"] == (0.0, True, ["env"])
    by_turn = rewards({"turn_id": "B-1", "value": 0.3}, {"group_id": "g", "value": 0.0})
    assert affected_trajectories(None, by_turn, None, steps)["trajectory_id"].to_list() == [
        "A",
        "B",
    ]


def test_every_step_carries_its_trajectorys_first_start():
    steps = pl.concat([_steps("A", start=30), _steps("B", start=5)])
    frame = reward_steps(steps, None, None, RewardConfig()).collect()
    firsts = frame.group_by("trajectory_id").agg(pl.col("trajectory_started_at").unique())
    assert sorted(firsts.rows()) == [("A", [at(30)]), ("B", [at(5)])]


def test_source_priority_and_latest_value_win():
    steps = _steps("A")
    landed = rewards(
        {"trajectory_id": "A", "value": 0.2, "source": "env", "created_at": at(10)},
        {"trajectory_id": "A", "value": 0.4, "source": "env", "created_at": at(20)},
        {"group_id": "g", "value": 0.9, "source": "human", "created_at": at(5)},
        {"turn_id": "A-0", "value": 0.1, "source": "rule", "created_at": at(5)},
    )
    evts = events(event("A", reward=0.7, when=15))
    got = _rewards_by_step(reward_steps(steps, landed, evts, RewardConfig()))
    assert got["A-2"] == (0.9, True, ["human"])
    assert got["A-0"] == (0.1, True, ["rule", "human"])
    env_first = RewardConfig(source_priority=["env", "human"])
    got = _rewards_by_step(reward_steps(steps, landed, evts, env_first))
    assert got["A-2"][0] == 0.4


@pytest.mark.parametrize(
    ("credit", "expected"),
    [
        (CreditAssignment(method="last_step"), [0.5, 0.0, 1.0]),
        (CreditAssignment(method="broadcast"), [1.5, 1.0, 1.0]),
        (CreditAssignment(method="discounted", gamma=0.5), [0.5 + 0.25, 0.5, 1.0]),
    ],
)
def test_credit_assignment(credit, expected):
    steps = _steps("A")
    landed = rewards({"trajectory_id": "A", "value": 1.0}, {"turn_id": "A-0", "value": 0.5})
    frame = reward_steps(steps, landed, None, RewardConfig(credit_assignment=credit)).collect()
    assert frame.sort("step_index")["reward"].to_list() == pytest.approx(expected)


def _metadata(truth: str, source: str = "math") -> str:
    return json.dumps({"claw": {"ground_truth": truth, "data_source": source}})


def _rules_as_stored(steps: pl.DataFrame, landed: pl.DataFrame, config: RewardConfig):
    """``rule_rewards`` of ``steps``, checked equal to those of the rows the step table stores
    (no replies) given the ``turns`` the replies are read from."""
    got = rule_rewards(steps, config).collect()
    stored = rule_rewards(steps.drop(TURN_COLUMNS), config, turns=landed).collect()
    assert stored.sort("reward_id").equals(got.sort("reward_id"))
    return got


def test_rule_rewards_read_ground_truth_from_metadata():
    rows = [
        *chain("exact", 1, metadata=_metadata("Paris"), response_text="  paris "),
        *chain("num", 1, base=100, metadata=_metadata("42"), response_text="so x = 41, then 42.0"),
        *chain("wrong", 1, base=200, metadata=_metadata("7"), response_text="it is 8"),
        *chain("other", 1, base=300, metadata=_metadata("7", "code"), response_text="7"),
        *chain("none", 1, base=400, response_text="7"),
    ]
    landed = turns(*rows)
    steps = extract_steps(landed, None, None, now=at(5000)).steps
    config = RewardConfig(
        rules=[
            RewardRule(name="em", rule="exact_match", data_source="math"),
            RewardRule(name="num", rule="numeric_match", data_source="math"),
            RewardRule(name="re", rule="regex_match", pattern=r"^\s*\d+\s*$"),
        ]
    )
    got = _rules_as_stored(steps, landed, config)
    values = {(r["trajectory_id"], r["name"]): r["value"] for r in got.iter_rows(named=True)}
    assert values[("exact", "em")] == 1.0 and values[("num", "em")] == 0.0
    assert values[("num", "num")] == 1.0 and values[("wrong", "num")] == 0.0
    assert ("other", "num") not in values and ("none", "em") not in values
    assert values[("none", "re")] == 1.0 and values[("wrong", "re")] == 0.0
    assert set(got["source"]) == {"rule"}


def test_registered_ground_truth_drives_the_rules_whenever_it_lands():
    """Claw-R1 agents send no metadata with their calls: the ground truth of their trajectory
    comes from its registration, which may land after the turns. A turn's own wins."""
    rows = [
        *chain("registered", 2, response_text="so it is 42"),
        *chain("own", 1, base=100, metadata=_metadata("7"), response_text="7"),
        *chain("bare", 1, base=200, response_text="7"),
    ]
    steps = extract_steps(turns(*rows), None, None, now=at(5000)).steps
    config = RewardConfig(rules=[RewardRule(name="num", rule="numeric_match", data_source="math")])
    assert rule_rewards(steps, config).collect().height == 1  # "own" alone has ground truth
    late = registrations(
        {"trajectory_id": "registered", "ground_truth": "41", "data_source": "math",
         "created_at": at(6000)},
        {"trajectory_id": "registered", "ground_truth": "42", "created_at": at(7000)},
        {"trajectory_id": "own", "ground_truth": "8", "data_source": "math", "created_at": at(1)},
    )  # fmt: skip
    touched = affected_trajectories(None, None, None, steps, late)
    assert touched["trajectory_id"].to_list() == ["own", "registered"]
    got = rule_rewards(steps, config, registrations=late).collect()
    assert dict(got.select("trajectory_id", "value").iter_rows()) == {"registered": 1.0, "own": 1.0}
    rewarded = _rewards_by_step(reward_steps(steps, None, None, config, registrations=late))
    assert rewarded["registered-1"] == (1.0, True, ["rule"])
    assert rewarded["bare-0"] == (None, False, [])


def _tool_message(arguments: str, name: str = "search") -> str:
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
    return json.dumps({"role": "assistant", "content": None, "tool_calls": [call]})


def test_tool_call_success_rule():
    rows = [
        *chain("ok", 2, response_message=_tool_message('{"q": "x"}'), metadata=_metadata("search")),
        *chain("bad", 2, base=100, response_message=_tool_message("{q: x")),
        *chain("plain", 1, base=200),
        *chain("failed", 1, base=300, response_message=_tool_message("{}"), status="error"),
    ]
    landed = turns(*rows)
    steps = extract_steps(landed, None, None, now=at(5000)).steps
    config = RewardConfig(rules=[RewardRule(name="tools", rule="tool_call_success")])
    got = dict(_rules_as_stored(steps, landed, config).select("trajectory_id", "value").iter_rows())
    assert got == {"ok": 1.0, "bad": 0.0, "plain": 0.0, "failed": 0.0}


def test_judge_is_off_by_default_and_pluggable():
    steps = _steps("A", "B")
    calls = []

    def judge(rows: pl.DataFrame) -> pl.Series:
        calls.append(rows.height)
        return pl.Series([0.8] * rows.height)

    assert rule_rewards(steps, RewardConfig(), judge=judge).collect().height == 0
    assert calls == []
    config = RewardConfig.model_validate({"judge": {"enabled": True}})
    frame = reward_steps(steps, None, None, config, judge=judge).collect()
    assert calls == [2]
    last = frame.filter(pl.col("is_last"))
    assert last["reward"].to_list() == [0.8, 0.8]
    assert last["reward_sources"].to_list() == [["model"], ["model"]]


def test_openai_judge_asks_an_openai_compatible_endpoint():
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers["Authorization"], **body})
            answer = "7" if "Paris" in body["messages"][0]["content"] else "no idea"
            reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(reply.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        judge = openai_judge(JudgeConfig(enabled=True, base_url=url, model="judge"))
        rows = pl.DataFrame(
            {"ground_truth": ["Paris", "x"], "response_text": ["paris", "y"],
             "request_messages": ["[]", "[]"]}
        )  # fmt: skip
        assert judge(rows).to_list() == [0.7, None]
    finally:
        server.shutdown()
        server.server_close()
    assert [s["path"] for s in seen] == ["/v1/chat/completions"] * 2
    assert seen[0]["model"] == "judge" and seen[0]["auth"].startswith("Bearer ")


def test_the_rewards_aimed_at_touched_steps_by_turn_trajectory_or_group():
    """A reward reaches a touched step through any of its three targets, old or new; rewards
    aimed elsewhere stay out, and no rewards table gives none."""
    touched = pl.DataFrame(
        {"turn_id": ["u1", "u2"], "trajectory_id": ["t1", "t1"], "group_id": ["g1", "g1"]}
    )
    landed = pl.LazyFrame(
        {
            "reward_id": ["by_turn", "by_trajectory", "by_group", "elsewhere"],
            "turn_id": ["u2", None, None, "u9"],
            "trajectory_id": [None, "t1", None, "t9"],
            "group_id": [None, None, "g1", "g9"],
        }
    )
    aimed = rewards_aimed_at(landed, touched)
    assert aimed.get_column("reward_id").to_list() == ["by_turn", "by_trajectory", "by_group"]
    assert rewards_aimed_at(None, touched) is None


def test_the_judge_reads_each_rows_conversation_from_its_turn(tmp_path):
    """Steps point at their turns: the judge sees a row's ``request_messages`` read from
    ``turns`` by turn_id, in the rows' order."""
    started = pa.array([at(1), at(2)], pa.timestamp("us", "UTC"))
    lake = Lake(str(tmp_path / "lake"))
    lake.append(
        "turns",
        pa.table(
            {"turn_id": ["u1", "u2"], "started_at": started, "request_messages": ["[m1]", "[m2]"]}
        ),
    )
    seen = []

    def judge(rows: pl.DataFrame) -> pl.Series:
        seen.extend(rows.get_column("request_messages"))
        return pl.Series([1.0] * rows.height)

    rows = pl.DataFrame({"turn_id": ["u2", "u1"], "started_at": pl.Series(started).reverse()})
    assert reading_conversations(judge, lake)(rows).to_list() == [1.0, 1.0]
    assert seen == ["[m2]", "[m1]"]
