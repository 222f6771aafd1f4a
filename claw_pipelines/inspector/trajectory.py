"""One trajectory step by step: its turns' full rows, prefix consistency, rewards, quality, labels.

Heavy columns (messages, token IDs, logprobs) are never held in memory; opening a trajectory reads
only the commits its turns landed in (their versions are in the index), through the change data
feed, with a predicate on the turn ids. Open trajectories come from `turns` too, so they are live.
"""

from __future__ import annotations

import contextlib

import polars as pl

from claw_pipelines.inspector import render
from claw_pipelines.inspector.api_models import (
    FullPrompt,
    PromptTokens,
    RewardOut,
    StepOut,
    TrajectoryDetail,
    TrajectoryRow,
)
from claw_pipelines.inspector.summary import latest_labels
from claw_pipelines.inspector.tables import LakeState
from claw_pipelines.lake import Lake
from claw_pipelines.lake.filters import sql_in
from claw_pipelines.turn_prompts import with_whole_prompts

UNSHOWN = {"api_request", "api_response"}
"""A Responses or Messages call's bodies in that API's own shape: the page shows the chat the
engine saw (its messages and tokens), and a Responses agent's bodies repeat its conversation."""


def read_turns(lake: Lake, located: pl.DataFrame) -> pl.DataFrame:
    """Full `turns` rows for ``located`` (turn_id, _commit_version), one CDF read per commit.

    Rows not found in their commit are found by a filtered scan instead: the commit's files
    were vacuumed away, or the version is only an upper bound (``lake.changes`` read a vacuumed
    table from its snapshot). Prompts and request texts stored as what they add to an earlier
    turn come whole (``turn_prompts``: the trajectory's earlier turns are read when needed).
    """
    table = lake.open("turns")
    if table is None or located.is_empty():
        return pl.DataFrame()
    columns = [f.name for f in table.schema().fields if f.name not in UNSHOWN]
    frames = []
    for (version,), part in located.group_by("_commit_version"):
        predicate = f"_change_type = 'insert' AND {sql_in('turn_id', part['turn_id'])}"
        with contextlib.suppress(Exception):  # vacuumed files: a bare Exception from the stream
            reader = table.load_cdf(
                starting_version=version,
                ending_version=version,
                columns=columns,
                predicate=predicate,
            )
            frames.append(pl.DataFrame(reader.read_all()).select(columns))
    found = pl.concat([pl.Series("turn_id", [], pl.String), *(f["turn_id"] for f in frames)])
    missing = located.filter(~pl.col("turn_id").is_in(found.implode()))
    if missing.height:
        wanted = missing.get_column("turn_id").implode()
        scan = lake.scan("turns").filter(pl.col("turn_id").is_in(wanted))
        frames.append(scan.select(columns).collect())
    stored = pl.concat(frames, how="vertical_relaxed").unique("turn_id", keep="first")
    return with_whole_prompts(stored, pl.scan_delta(table))


def _starts_with(ids: pl.Expr, prefix: pl.Expr) -> pl.Expr:
    """Whether list ``ids`` begins with list ``prefix``: ``prefix`` + the rest of ``ids`` equals
    ``ids``. A head of per-row length copies each list's head (40 ms over a 100-call session's
    prompts); a slice to the end does not."""
    rest = ids.list.slice(prefix.list.len().fill_null(0), ids.list.len())
    return pl.concat_list(prefix, rest) == ids


def prefix_check(steps: pl.LazyFrame) -> pl.LazyFrame:
    """Whether each step of one trajectory extends the previous step's prompt + response IDs.

    ``prefix_consistent`` is null on a trajectory's first step; a break says which part differs:
    the earlier prompt itself (context edit or template change) or the earlier response
    (retokenized or edited before it was sent back). ``shared_prefix_computed`` counts the
    leading tokens known to repeat the previous step: all of its prompt + response, its prompt
    alone after a response that was not sent back as is, else none. One trajectory's steps in
    order, so a plain shift: a window (``over``) copied every token list of a long session.
    """
    prompt = pl.col("prompt_token_ids")
    prev_prompt = prompt.shift(1)
    prev_response = pl.col("response_token_ids").shift(1)
    expected = pl.concat_list(prev_prompt, prev_response)
    extends_prompt = _starts_with(prompt, prev_prompt)
    consistent = _starts_with(prompt, expected)
    return steps.sort("step_index").with_columns(
        pl.when(pl.col("step_index") == 0)
        .then(None)
        .otherwise(consistent.fill_null(False))
        .alias("prefix_consistent_computed"),
        pl.when((pl.col("step_index") == 0) | consistent.fill_null(False))
        .then(None)
        .when(prompt.is_null() | prev_prompt.is_null() | prev_response.is_null())
        .then(pl.lit("token IDs missing"))
        .when(~extends_prompt)
        .then(pl.lit("context edit: prompt does not extend the previous prompt"))
        .otherwise(
            pl.lit("previous response not reproduced token for token (retokenized or edited)")
        )
        .alias("prefix_break_reason_computed"),
        pl.when(pl.col("step_index") == 0)
        .then(0)
        .when(consistent)
        .then(expected.list.len())
        .when(extends_prompt)
        .then(prev_prompt.list.len())
        .otherwise(0)
        .alias("shared_prefix_computed"),
    )


BULKY = ["prompt_token_ids", "request_messages", "request_tools", "api_request", "api_response"]
"""A long session's bulk: each call repeats the conversation so far. Joins and sorts run
without it, and the page's columns of it are gathered once, in step order, at the end."""


def step_frame(turns: pl.DataFrame, state: LakeState) -> pl.DataFrame:
    """The trajectory's steps with everything the page shows, in step order.

    The pipeline's own step index and prefix verdict win when `steps` has the trajectory (a
    failed call without token IDs is no step there: it has no index or verdict and is shown
    after the step before it); otherwise (open trajectories, or before Dagster ran) they are
    computed here the same way.
    The first step has no verdict (the pipeline calls it consistent; there is nothing to extend).
    The prompt's token IDs stay out: a step carries their count and what it added.
    """
    ids = turns["turn_id"].implode()
    steps = (
        state["steps"].filter(pl.col("turn_id").is_in(ids)).drop("_commit_version", "trajectory_id")
    )
    bulky = [c for c in BULKY if c in turns.columns]
    light = _indexed(turns.lazy().drop(bulky).join(steps.lazy(), on="turn_id", how="left"))
    tokens = turns.lazy().select("turn_id", "prompt_token_ids", "response_token_ids")
    verdicts = _token_verdicts(light, tokens)
    frame = _with_verdicts(
        light.drop("shared_prefix_tokens").join(verdicts, on="turn_id", how="left")
    )
    for facts in _step_facts(state, ids):
        frame = frame.join(facts.lazy(), on="turn_id", how="left")
    ordered = (
        frame.with_columns(
            ((pl.col("ended_at") - pl.col("started_at")).dt.total_milliseconds()).alias(
                "duration_ms"
            )
        )
        .sort("started_at", "turn_id")
        .with_columns(pl.col("step_index").forward_fill().fill_null(-1).alias("_order"))
        .sort("_order", "started_at", "turn_id")
        .drop("_order")
        .collect()
    )
    shown = [c for c in ("request_messages", "request_tools") if c in turns.columns]
    return ordered.join(
        turns.select("turn_id", *shown), on="turn_id", how="left", maintain_order="left"
    )


def _indexed(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Each step's index: the pipeline's, else its place in time."""
    return frame.with_columns(
        pl.when(pl.col("step_index").is_not_null().any())
        .then(pl.col("step_index").cast(pl.Int64))
        .otherwise(pl.col("started_at").rank("ordinal").cast(pl.Int64) - 1)
        .alias("step_index")
    )


def _token_verdicts(steps: pl.LazyFrame, tokens: pl.LazyFrame) -> pl.LazyFrame:
    """Per turn, from its token IDs: the computed prefix verdict, the prompt's length, the
    prefix it shares with the previous step (the pipeline's count, else the computed one) and
    the tokens it added after that prefix."""
    prompt = pl.col("prompt_token_ids")
    shared = pl.coalesce("shared_prefix_tokens", "shared_prefix_computed", pl.lit(0))
    return (
        steps.select("turn_id", "step_index", "shared_prefix_tokens")
        .join(tokens, on="turn_id", how="left")
        .pipe(prefix_check)
        .with_columns(
            pl.when(prompt.is_not_null())
            .then(shared.clip(0, prompt.list.len()))
            .alias("shared_prefix_tokens")
        )
        .select(
            "turn_id",
            "prefix_consistent_computed",
            "prefix_break_reason_computed",
            "shared_prefix_tokens",
            prompt.list.len().fill_null(0).alias("prompt_token_count"),
            prompt.list.slice(pl.col("shared_prefix_tokens")).alias("added_token_ids"),
        )
    )


def _with_verdicts(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Each step's prefix verdict: the pipeline's, else the one computed here."""
    return frame.with_columns(
        pl.when((pl.col("step_index") == 0) | pl.col("step_index").is_null())
        .then(None)
        .otherwise(pl.coalesce("prefix_consistent", "prefix_consistent_computed"))
        .alias("prefix_consistent"),
        pl.when(pl.col("prefix_consistent").is_not_null())
        .then(pl.col("prefix_break_reason"))
        .when(pl.col("step_index").is_not_null())
        .then(pl.col("prefix_break_reason_computed"))
        .alias("prefix_break_reason"),
        pl.col("prefix_consistent").is_not_null().alias("prefix_from_pipeline"),
    ).drop("prefix_consistent_computed", "prefix_break_reason_computed")


def _step_facts(state: LakeState, ids: pl.Series) -> list[pl.DataFrame]:
    """Per turn of ``ids``: its credited reward and quality, its rewards, its latest label."""
    scored = (
        state["scored_steps"]
        .filter(pl.col("turn_id").is_in(ids))
        .select(
            "turn_id", pl.col("reward").alias("credited_reward"), "quality_score", "quality_reasons"
        )
    )
    step_rewards = (
        state["rewards"]
        .filter(pl.col("turn_id").is_in(ids))
        .sort("created_at")
        .group_by("turn_id")
        .agg(pl.struct("name", "value", "source", "created_at").alias("rewards"))
    )
    labels = latest_labels(state["labels"].filter(pl.col("target_id").is_in(ids)), "step").select(
        pl.col("target_id").alias("turn_id"),
        pl.col("quality_label").alias("label"),
        "trainable",
        "tags",
        pl.col("note").alias("label_note"),
        pl.col("author").alias("label_author"),
        pl.col("created_at").alias("labelled_at"),
    )
    return [scored, step_rewards, labels]


def trajectory_rewards(state: LakeState, trajectory_id: str, group_id: str | None) -> pl.DataFrame:
    """Rewards aimed at the whole trajectory or its group, and the completion event's reward."""
    rewards = state["rewards"].filter(
        (pl.col("trajectory_id") == trajectory_id)
        | (pl.col("group_id").is_not_null() & (pl.col("group_id") == group_id))
    )
    events = state["trajectory_events"].filter(
        (pl.col("trajectory_id") == trajectory_id) & pl.col("reward").is_not_null()
    )
    return pl.concat(
        [
            rewards.select(
                pl.when(pl.col("trajectory_id").is_not_null())
                .then(pl.lit("trajectory"))
                .otherwise(pl.lit("group"))
                .alias("target"),
                "name",
                "value",
                "source",
                "created_at",
            ),
            events.select(
                pl.lit("trajectory").alias("target"),
                pl.concat_str(pl.lit("event:"), "event").alias("name"),
                pl.col("reward").alias("value"),
                pl.lit("env").alias("source"),
                "created_at",
            ),
        ]
    ).sort("created_at")


def load_trajectory(lake: Lake, state: LakeState, trajectory_id: str) -> pl.DataFrame:
    """The steps of one trajectory (empty if the index does not know it)."""
    located = state["turns"].filter(pl.col("trajectory_id") == trajectory_id)
    turns = read_turns(lake, located.select("turn_id", "_commit_version"))
    if turns.is_empty():
        return turns
    turns = turns.with_columns(pl.lit(trajectory_id).alias("trajectory_id"))
    return step_frame(turns, state)


def _rewards(items: list[dict] | None, target: str = "step") -> list[RewardOut]:
    return [RewardOut(**{"target": target, **r}) for r in items or []]


def repeated_messages(messages: list[dict], earlier: list[dict]) -> int:
    """How many leading ``messages`` equal ``earlier`` (the previous step's messages + reply).

    Counting by content rather than by length keeps an edited system prompt or an injected
    message among the new ones when a step breaks the prefix.
    """
    count = 0
    for message, before in zip(messages, earlier, strict=False):
        if message != before:
            break
        count += 1
    return count


def _declared_tools(request_tools: str | None) -> list[dict] | None:
    tools = render.parse_json(request_tools)
    return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else None


def _raw_messages(request_messages: str | None) -> list[dict]:
    parsed = render.parse_json(request_messages)
    return [m for m in parsed if isinstance(m, dict)] if isinstance(parsed, list) else []


def _appended(text: str | None, earlier: str | None) -> list[dict] | None:
    """The messages ``text`` (a JSON list) holds after those of ``earlier``, when it is
    ``earlier``'s list with messages appended, written alike (as one writer writes a session's
    calls): only the appended part is parsed, not the whole conversation again. None otherwise."""
    if not text or not earlier or not earlier.endswith("]") or not text.startswith(earlier[:-1]):
        return None
    tail = text[len(earlier) - 1 :].lstrip()
    if not tail.startswith(","):
        return None
    return _raw_messages("[" + tail[1:])


def _reply(response: dict, content: str) -> dict:
    return render.message({"role": "assistant", **response, "content": content})


def to_steps(frame: pl.DataFrame) -> list[StepOut]:
    """The page's step models (one trajectory's worth of rows, so a short loop).

    Only what each step added is rendered: a prefix-consistent step's prompt is the previous
    one's messages + its reply + what came after (its tokens prove it), so its new messages are
    those past that count; a step that broke the prefix is compared message by message.
    """
    tokens = render.tokens_by_step(frame, "response_token_ids", "response_logprobs")
    added = render.texts_by_step(frame, "added_token_ids")
    steps = []
    previous: tuple[str | None, list[dict], dict] | None = None
    for row in frame.to_dicts():
        response = render.parse_json(row["response_message"])
        response = response if isinstance(response, dict) else {}
        content = render.content_text(response.get("content")) or (row["response_text"] or "")
        text = row["request_messages"]
        appended = _appended(text, previous[0]) if previous and row["prefix_consistent"] else None
        if previous is None:
            raw, earlier = _raw_messages(text), 0
        elif appended:
            raw, earlier = [*previous[1], *appended], len(previous[1]) + 1
        else:
            raw = _raw_messages(text)
            before = [*(render.message(m) for m in previous[1]), previous[2]]
            earlier = repeated_messages([render.message(m) for m in raw], before)
        steps.append(
            StepOut(
                **{k: row.get(k) for k in STEP_FIELDS},
                new_messages=[render.message(m) for m in raw[earlier:]],
                message_count=len(raw),
                earlier_messages=earlier,
                tools=_declared_tools(row.get("request_tools")),
                response={
                    "content": content,
                    "tool_calls": render.tool_calls(response.get("tool_calls")),
                    "reasoning": response.get("reasoning_content"),
                },
                response_tokens=tokens.get(row["turn_id"]),
                added_text=added.get(row["turn_id"]),
                rewards=_rewards(row["rewards"]),
                metadata=render.parse_json(row["metadata"]),
                sampling_params=render.parse_json(row["sampling_params"]),
            )
        )
        previous = (text, raw, _reply(response, content))
    return steps


STEP_FIELDS = [
    "turn_id",
    "step_index",
    "status",
    "error",
    "finish_reason",
    "token_source",
    "model",
    "backend",
    "policy_version",
    "started_at",
    "ended_at",
    "duration_ms",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "response_token_ids",
    "prompt_token_count",
    "shared_prefix_tokens",
    "added_token_ids",
    "prefix_consistent",
    "prefix_break_reason",
    "prefix_from_pipeline",
    "credited_reward",
    "quality_score",
    "quality_reasons",
    "label",
    "trainable",
    "tags",
    "label_note",
    "label_author",
]


def summary_row(state: LakeState, trajectory_id: str) -> TrajectoryRow | None:
    row = state.summary.filter(pl.col("trajectory_id") == trajectory_id)
    return TrajectoryRow(**row.row(0, named=True)) if row.height else None


def trajectory_detail(lake: Lake, state: LakeState, trajectory_id: str) -> TrajectoryDetail | None:
    """Everything the trajectory page shows, or None if the index has never seen it."""
    summary = summary_row(state, trajectory_id)
    if summary is None:
        return None
    frame = load_trajectory(lake, state, trajectory_id)
    steps = state["steps"]
    parents = steps.filter(pl.col("trajectory_id") == trajectory_id)["parent_trajectory_id"]
    sides = steps.filter(pl.col("parent_trajectory_id") == trajectory_id)["trajectory_id"]
    return TrajectoryDetail(
        parent_trajectory_id=parents.drop_nulls().first(),
        side_trajectories=sides.unique().sort().to_list(),
        summary=summary,
        trajectory_rewards=_rewards(
            trajectory_rewards(state, trajectory_id, summary.group_id).to_dicts(), "trajectory"
        ),
        steps=to_steps(frame) if frame.height else [],
        in_steps_table=bool(frame.height)
        and bool(state["steps"]["turn_id"].is_in(frame["turn_id"].implode()).any()),
    )


def _turn(lake: Lake, state: LakeState, turn_id: str) -> dict | None:
    """One turn's full row, read with the rest of its trajectory: a turn stored as a suffix of
    an earlier call is rebuilt from the turns before it."""
    index = state["turns"]
    trajectory = index.filter(pl.col("turn_id") == turn_id)["trajectory_id"]
    if trajectory.is_empty():
        return None
    located = index.filter(pl.col("trajectory_id") == trajectory[0])
    turns = read_turns(lake, located.select("turn_id", "_commit_version"))
    row = turns.filter(pl.col("turn_id") == turn_id)
    return row.row(0, named=True) if row.height else None


def prompt_tokens(lake: Lake, state: LakeState, turn_id: str) -> PromptTokens | None:
    """A step's prompt token IDs (decoded when they are the embedded engine's), read on demand."""
    turn = _turn(lake, state, turn_id)
    if turn is None:
        return None
    frame = pl.DataFrame([turn]).select("turn_id", "model", "backend", "prompt_token_ids")
    decoded = render.tokens_by_step(frame, "prompt_token_ids", None).get(turn_id)
    return PromptTokens(
        turn_id=turn_id,
        ids=turn["prompt_token_ids"] or [],
        tokens=decoded,
    )


def full_prompt(lake: Lake, state: LakeState, turn_id: str) -> FullPrompt | None:
    """A step's whole prompt: every message, the declared tools and the token IDs."""
    turn = _turn(lake, state, turn_id)
    if turn is None:
        return None
    return FullPrompt(
        turn_id=turn_id,
        trajectory_id=turn["trajectory_id"],
        messages=render.messages(turn["request_messages"]),
        tools=_declared_tools(turn["request_tools"]),
        token_ids=turn["prompt_token_ids"] or [],
    )
