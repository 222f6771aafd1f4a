"""The derived tables' schemas, declared once.

Every transform output is conformed to one of these before it is written, so the Delta tables,
the batch rows handed to exporters and the inspector all agree on names and types. Strings are
plain Arrow strings (not polars' string views) so every Delta reader can open the files.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

import polars as pl
import pyarrow as pa

from claw_pipelines.lake.filters import floor_ms, keyed
from claw_pipelines.lake.properties import statistics_only
from claw_pipelines.schemas import LANDING_MODELS, Turn, polars_schema
from claw_pipelines.turn_prompts import read_columns, with_whole_prompts

_TOKENS = pa.list_(pa.int32())
_LOGPROBS = pa.list_(pa.float32())
_TS = pa.timestamp("us", tz="UTC")
_STRINGS = pa.list_(pa.string())

_TURN = Turn.arrow_schema()


def _turn_fields(*names: str) -> list[pa.Field]:
    return [_TURN.field(name) for name in names]


STEP_SOURCE_COLUMNS = [
    "turn_id", "trajectory_id", "group_id", "channel", "agent", "policy_version", "model",
    "prompt_token_ids", "response_token_ids", "response_logprobs", "token_source", "finish_reason",
    "status", "request_messages", "request_tools", "response_message", "response_text", "metadata",
    "started_at", "ended_at",
]  # fmt: skip
"""The turns columns a step carries over."""

TURN_COLUMNS = [
    "prompt_token_ids", "response_token_ids", "response_logprobs", "request_messages",
    "request_tools", "response_message", "response_text",
]  # fmt: skip
"""The heavy per-turn columns that only ``turns`` stores: derived rows (steps, the step tables,
grpo-style batch rows) point at their turn by ``turn_id`` (with its ``started_at`` and
``source_version``, the turns version it landed in) and readers join these from ``turns``
(``with_turn_columns``). Turns are append-only and never rewritten, so the join gives the same
values however late it runs. ``request_messages`` repeats the conversation so far on every
step, so a table carrying it grows quadratically with trajectory length; the reply
(``response_message``, ``response_text``) is stored once in ``turns`` like the rest."""

TOKEN_COLUMNS = ["prompt_token_ids", "response_token_ids", "response_logprobs"]
"""The token lists among ``TURN_COLUMNS``."""

SIGNAL_COLUMNS = [
    "logprobs_len", "repetition_ngram", "repeated_ngram_ratio", "reply_blank",
    "malformed_tool_calls",
]  # fmt: skip
"""What the quality signals need from the token lists and the reply, computed once by the step
extractor while the turn is in memory (``transforms.quality.token_signals``): scoring then
reads no token list or reply unless the configured n-gram differs from ``repetition_ngram``
(or the row predates a signal: null)."""

EXTRACTED_STEPS = pa.schema(
    [
        pa.field("step_id", pa.string(), nullable=False),
        *_turn_fields(*STEP_SOURCE_COLUMNS),
        pa.field("step_index", pa.int32()),
        pa.field("is_last", pa.bool_()),
        pa.field("prefix_consistent", pa.bool_()),
        pa.field("prefix_break_reason", pa.string()),
        pa.field("shared_prefix_tokens", pa.int32()),
        pa.field("prompt_len", pa.int32()),
        pa.field("response_len", pa.int32()),
        pa.field("trajectory_inferred", pa.bool_()),
        pa.field("reopened", pa.bool_()),
        pa.field("close_reason", pa.string()),
        pa.field("failed_calls", pa.int32()),
        pa.field("source_version", pa.int64()),
        pa.field("parent_trajectory_id", pa.string()),
    ]
)
"""One row per LLM call of a closed trajectory (state = prompt ids, action = response ids), as
the step extractor makes it, with the turn's ``TURN_COLUMNS``. A failed call without token IDs
is no step.

``shared_prefix_tokens``: tokens shared with the previous step's prompt + response (prefix-tree
saving; with ``prefix_break_reason`` it says how much of the prompt a break kept);
``prompt_len`` / ``response_len``: the token lists' lengths (null when the list is), so readers
that need only lengths skip the lists; ``reopened``: emitted after its trajectory had already
been emitted; ``close_reason``: completed | aborted | timeout (why the trajectory was closed);
``failed_calls``: the calls of the trajectory's session the engine or proxy failed (``status``
error) in the emission that made the step, those without token IDs (no step) included, so the
planner can leave such a trajectory out (``infra_failure``); null on rows written before it;
``source_version``: the turns version the turn landed in;
``parent_trajectory_id``: set on the steps of a side trajectory (a side call inside the
parent's session, ``transforms.threads``), whose trajectory_id is
``<parent>/side-<its first turn_id>``."""

STEPS = pa.schema(
    [
        *(f for f in EXTRACTED_STEPS if f.name not in TURN_COLUMNS),
        pa.field("logprobs_len", pa.int32()),
        pa.field("repetition_ngram", pa.int32()),
        pa.field("repeated_ngram_ratio", pa.float64()),
        pa.field("reply_blank", pa.bool_()),
        pa.field("malformed_tool_calls", pa.int32()),
    ]
)
"""Table ``steps``: an extracted step without its ``TURN_COLUMNS`` (it points at its turn),
plus ``SIGNAL_COLUMNS``: ``logprobs_len`` (null when the turn has no logprobs), the share of
the response's ``repetition_ngram``-grams that repeat an earlier one, ``reply_blank`` (no
text and no tool call) and ``malformed_tool_calls`` (the reply's tool calls without a name or
with arguments that are not JSON). A table written before steps pointed at turns still holds
the turn columns in its older rows (null in newer ones): nothing reads them, and a rebuild of
the table drops them (``LEGACY_COLUMNS``)."""

LEGACY_COLUMNS = frozenset(TURN_COLUMNS)
"""Columns a derived table written by an earlier version may still hold: ``steps`` and the
step tables carried ``request_messages`` and the reply, the steps and batches the token lists
and the batches ``response_message``. Delta
cannot drop a column without rewriting the table, so they stay (null in rows written since)
and the schema checks accept them; a rebuild of the derived tables from ``turns`` drops them."""

OPEN_STATE = pa.schema(
    [
        pa.field("state", pa.string(), nullable=False),
        *[f.with_nullable(True) for f in EXTRACTED_STEPS if f.name not in (
            "step_id", "is_last", "prefix_consistent", "prefix_break_reason",
            "shared_prefix_tokens", "prompt_len", "response_len", "failed_calls",
            "parent_trajectory_id")],
        *_turn_fields("prompt_prefix_turn_id", "prompt_prefix_len", "prompt_len"),
        pa.field("closed_at", _TS),
        pa.field("emitted_turn_ids", _STRINGS),
    ]
)  # fmt: skip
"""The step extractor's carried-over state (table ``steps_open``, overwritten each run).

``state = open``: a turn of a trajectory not closed yet (the turn columns the extractor reads,
trajectory_id resolved, step_index null), its prompt as ``turns`` stores it: with
``prompt_prefix_turn_id`` and ``prompt_prefix_len`` set, only what it adds to that turn's
prompt + response (``turn_prompts``: a later run rebuilds it from the trajectory's earlier
turns, here or in ``turns``), and ``prompt_len`` its whole length; the request texts as
the extractor got them (the steps asset reads none: null). ``state = closed``: the tail of
an emitted trajectory, kept for the reopen window: its last emitted step (step_index,
turn_id; token ids and other columns null, a late turn's prefix check reads that step's
tokens back from ``steps`` by turn_id), ``closed_at``, ``close_reason`` and
``emitted_turn_ids`` (to drop duplicate re-deliveries)."""

TAIL_COLUMNS = [
    "state", "trajectory_id", "turn_id", "group_id", "step_index", "token_source",
    "close_reason", "trajectory_inferred", "started_at", "closed_at", "emitted_turn_ids",
]  # fmt: skip
"""What a closed tail holds: enough to number a late turn, find its last step and drop
re-delivered turns; no token lists (those are read back from ``steps`` when needed)."""

CLOSED_TAILS = pa.schema(
    [
        *(OPEN_STATE.field(name) for name in TAIL_COLUMNS),
        pa.field("run", pa.int64(), False),
        pa.field("attempt", pa.int64()),
    ]
)
"""Table ``steps_tails``: the closed tails, appended by the steps run (``run``, ``attempt``) that
closed a trajectory or extended it with late turns; a trajectory's current tail is its row with
the highest ``step_index``. Rows with ``state = committed`` record that the attempt ``-attempt``
made a steps commit, so its tails count (``incremental.closed_tails``)."""

TRAJECTORIES = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string()),
        pa.field("channel", pa.string()),
        pa.field("agent", pa.string()),
        pa.field("num_steps", pa.int32()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("response_tokens", pa.int64()),
        pa.field("started_at", _TS),
        pa.field("ended_at", _TS),
        pa.field("duration_s", pa.float64()),
        pa.field("complete", pa.bool_()),
        pa.field("outcome", pa.string()),
        pa.field("outcome_reward", pa.float64()),
        pa.field("policy_versions", pa.list_(pa.int64())),
        pa.field("shared_prefix_tokens_saved", pa.int64()),
        pa.field("trajectory_inferred", pa.bool_()),
        pa.field("prefix_consistent", pa.bool_()),
        pa.field("parent_trajectory_id", pa.string()),
    ]
)
"""One row per trajectory (side trajectories included: ``parent_trajectory_id`` names the
trajectory whose session they ran in)."""

REWARDED_STEPS = pa.schema(
    [
        *STEPS,
        pa.field("step_reward", pa.float64()),
        pa.field("outcome_reward", pa.float64()),
        pa.field("reward", pa.float64()),
        pa.field("reward_present", pa.bool_()),
        pa.field("reward_sources", _STRINGS),
        pa.field("trajectory_started_at", _TS),
    ]
)
"""``step_reward``: immediate reward aimed at the turn; ``outcome_reward``: the trajectory's
outcome (trajectory/group/event rewards); ``reward``: credited per the credit-assignment rule;
``trajectory_started_at``: the earliest ``started_at`` of the trajectory's steps (each run
recomputes a trajectory from all of them), which the batch ledger and retirements keep so that
planning reads only their recent end (``batching.planner``); null in rows written before it."""

SCORED_STEPS = pa.schema(
    [
        *REWARDED_STEPS,
        pa.field("quality_score", pa.float64()),
        pa.field("quality_reasons", _STRINGS),
    ]
)

CURATED_STEPS = pa.schema(
    [
        *SCORED_STEPS,
        pa.field("quality_label", pa.string()),
        pa.field("trainable", pa.bool_()),
        pa.field("tags", _STRINGS),
        pa.field("label_note", pa.string()),
    ]
)

BATCH_ROWS = pa.schema(
    [
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("recipe", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("trajectory_id", pa.string()),
        pa.field("step_index", pa.int32()),
        pa.field("is_last", pa.bool_()),
        pa.field("num_steps", pa.int32()),
        pa.field("group_size", pa.int32()),
        pa.field("turn_id", pa.string()),
        pa.field("prompt_token_ids", _TOKENS),
        pa.field("response_token_ids", _TOKENS),
        pa.field("response_logprobs", _LOGPROBS),
        pa.field("reward", pa.float64()),
        pa.field("outcome_reward", pa.float64()),
        pa.field("trajectory_score", pa.float64()),
        pa.field("advantage", pa.float64()),
        pa.field("policy_version", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("request_messages", pa.string()),
        pa.field("request_tools", pa.string()),
        pa.field("response_message", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("source_version", pa.int64()),
        pa.field("source_versions", pa.string()),
        pa.field("started_at", _TS),
        pa.field("prompt_len", pa.int32()),
        pa.field("response_len", pa.int32()),
        pa.field("prefix_consistent", pa.bool_()),
        pa.field("prefix_break_reason", pa.string()),
        pa.field("segment_index", pa.int32()),
    ]
)
"""Framework-neutral rows of one batch (grpo, rloo, ppo, reinforce_pp, sft): one per step,
contiguous per trajectory in step order. ``trajectory_score``: the trajectory's return (outcome
plus step rewards, whatever the credit assignment); ``advantage``: null unless the recipe's
``group_statistics`` is ``per_trajectory`` (then the group-relative advantage of the
trajectory's score, broadcast to its steps); otherwise the trainer computes advantages.
``model``: the model that answered (whose tokenizer made the IDs); ``finish_reason``: ``length``
for a reply cut off at max_tokens. ``source_version``: turns version the step came from;
``source_versions``: JSON of the input table versions the batch was planned from;
``started_at``: the turn's, which bounds the read of its ``TURN_COLUMNS`` from ``turns``.
``prompt_len`` .. ``prefix_break_reason``: the step's, from which ``transforms.sequences``
builds the trajectory's sequences without reading every prompt; ``segment_index``: the
sequence (segment) of its trajectory the step belongs to."""

STORED_BATCH_ROWS = pa.schema([f for f in BATCH_ROWS if f.name not in TURN_COLUMNS])
"""What ``batches/<recipe>`` holds of a grpo-style batch: its rows without ``TURN_COLUMNS``,
which readers join from ``turns`` (``batches.rows.batch_rows``), so the lake keeps the token
lists once in ``turns`` and once per export."""

_SPAN = pa.struct(
    [
        pa.field("step_index", pa.int32()),
        pa.field("turn_id", pa.string()),
        pa.field("start", pa.int32()),
        pa.field("end", pa.int32()),
        pa.field("reward", pa.float64()),
    ]
)

SEQUENCE_ROWS = pa.schema(
    [
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("recipe", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("trajectory_id", pa.string()),
        pa.field("segment_index", pa.int32()),
        pa.field("num_segments", pa.int32()),
        pa.field("break_reason", pa.string()),
        pa.field("first_step_index", pa.int32()),
        pa.field("last_step_index", pa.int32()),
        pa.field("segment_steps", pa.int32()),
        pa.field("num_steps", pa.int32()),
        pa.field("is_last", pa.bool_()),
        pa.field("group_size", pa.int32()),
        pa.field("turn_id", pa.string()),
        pa.field("turn_ids", _STRINGS),
        pa.field("prompt_token_ids", _TOKENS),
        pa.field("response_token_ids", _TOKENS),
        pa.field("response_mask", pa.list_(pa.int8())),
        pa.field("response_logprobs", _LOGPROBS),
        pa.field("spans", pa.list_(_SPAN)),
        pa.field("reward", pa.float64()),
        pa.field("outcome_reward", pa.float64()),
        pa.field("trajectory_score", pa.float64()),
        pa.field("advantage", pa.float64()),
        pa.field("policy_version", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_messages", pa.string()),
        pa.field("request_messages", pa.string()),
        pa.field("request_tools", pa.string()),
        pa.field("response_message", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("source_version", pa.int64()),
        pa.field("source_versions", pa.string()),
        pa.field("started_at", _TS),
    ]
)
"""Batch rows in the ``sequence`` layout (``transforms.sequences``): one per segment, a maximal
run of a trajectory's prefix-consistent steps. ``prompt_token_ids``: the segment's first prompt;
``response_token_ids``: everything after it (reply, observation, reply, ... last reply), with
``response_mask`` 1 on reply tokens and 0 on observations and ``response_logprobs`` aligned (0.0
on observations; null when a step has none); ``spans``: each step's reply at
``[start, end)`` of the response with its credited reward; ``break_reason``: why the segment
does not extend the one before (null for the first); ``turn_id``: the last step's turn, whose
``request_messages`` (the whole conversation), ``response_message`` and ``finish_reason`` the
row carries; ``prompt_messages``: the first step's request (the state the segment starts
from); ``reward``: the last step's credited reward; ``policy_version``: the oldest policy of its
steps; ``num_steps``: the trajectory's steps, ``segment_steps`` the segment's."""

DPO_PAIRS = pa.schema(
    [
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("recipe", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("trajectory_id", pa.string()),
        pa.field("step_index", pa.int32()),
        pa.field("turn_id", pa.string()),
        pa.field("rejected_turn_id", pa.string()),
        pa.field("prompt_token_ids", _TOKENS),
        pa.field("chosen_token_ids", _TOKENS),
        pa.field("rejected_token_ids", _TOKENS),
        pa.field("chosen_reward", pa.float64()),
        pa.field("rejected_reward", pa.float64()),
        pa.field("policy_version", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("chosen_finish_reason", pa.string()),
        pa.field("rejected_finish_reason", pa.string()),
        pa.field("request_messages", pa.string()),
        pa.field("request_tools", pa.string()),
        pa.field("chosen_message", pa.string()),
        pa.field("rejected_message", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("source_version", pa.int64()),
        pa.field("source_versions", pa.string()),
    ]
)
"""DPO batch rows: a chosen and a rejected action from the same state (same group, same
prompt_token_ids); ``turn_id`` is the chosen step's turn."""

DROPPED = pa.schema(
    [
        pa.field("turn_id", pa.string()),
        pa.field("trajectory_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("reason", pa.string()),
    ]
)
"""Steps a batch plan left out and why (inspector batch preview)."""

RETIRED = pa.schema([*DROPPED, pa.field("trajectory_started_at", _TS), pa.field("retired_at", _TS)])
"""``batch_retired/<recipe>``: steps a recipe's plans dropped for good (``planner.final_drops``),
with their trajectory's first start when retired (null in rows retired before it was kept)."""

LEDGER = pa.schema(
    [
        pa.field("recipe", pa.string(), nullable=False),
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("turn_id", pa.string(), nullable=False),
        pa.field("trajectory_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("trajectory_started_at", _TS),
        pa.field("planned_at", _TS),
    ]
)
"""``batch_ledger/<recipe>``: which steps a recipe already consumed (a step goes into at most one
batch of a recipe), with their trajectory's first start when consumed (null in rows consumed
before it was kept): planning reads only the rows of trajectories started since its window
(``planner.started_since``)."""

SKIPPING_COLUMNS = sorted(
    {
        f.name
        for schema in [
            STEPS, OPEN_STATE, CLOSED_TAILS, TRAJECTORIES, REWARDED_STEPS, SCORED_STEPS,
            CURATED_STEPS, BATCH_ROWS, DPO_PAIRS, RETIRED, LEDGER,
            *(model.arrow_schema() for model in LANDING_MODELS.values()),
        ]
        for f in schema
        if not pa.types.is_nested(f.type)
    }
)  # fmt: skip
"""Every flat column (ids, times, versions, scores) of every table: the ones readers skip files
and row groups by, so the derived tables' writer keeps their statistics. The lists (token IDs,
logprobs, reasons) get none: nobody filters on them, and min/max over every token ID is a
quarter of a token table's write time."""

ROW_GROUP_ROWS = 8192
"""Small row groups, so re-reading a chunk of (time-ordered) trajectory ids skips the rest of
a file by its statistics instead of decoding every token list in it."""

WRITER = statistics_only(SKIPPING_COLUMNS, max_row_group_size=ROW_GROUP_ROWS)
"""How every derived table is written (``lake.properties.statistics_only``): for token-ID
lists the writer's defaults cost ~4x the write time (6.3 s against 1.4 s for 100k steps of
1,280 tokens); dropping their chunk statistics too takes a 100k-step write from ~0.6 s to
~0.5 s."""


def with_turn_columns(
    rows: pl.DataFrame,
    turns: pl.LazyFrame | pl.DataFrame | None,
    columns: list[str] = TURN_COLUMNS,
) -> pl.DataFrame:
    """``rows`` with their turns' ``columns`` read from ``turns`` by turn_id (see
    ``TURN_COLUMNS``), in ``rows``' order. Turn ids are random, so a read by id alone would
    decode every file: the rows' ``started_at`` range (to the millisecond of Delta's file
    statistics) goes first, and turns land in time order, so a scan decodes only the files and
    row groups of that window (``_by_turn`` matches them to the rows). A turn re-delivered
    under the same id counts once. Columns ``turns`` lacks are null. Prompts and request
    texts stored as what they add to an earlier turn come whole (``turn_prompts``)."""
    readable = [] if turns is None or rows.is_empty() else turns.lazy().collect_schema().names()
    found = [name for name in columns if name in readable]
    joined = rows.drop(columns, strict=False)
    if found:
        window = turns.lazy()
        if "started_at" in rows.columns and "started_at" in readable:
            window = window.filter(started_within(rows.get_column("started_at")))
        turn_ids = rows.get_column("turn_id")
        needed = [name for name in read_columns(found, readable) if name != "turn_id"]
        stored = _by_turn(window, turn_ids, needed).insert_column(0, turn_ids)
        whole = with_whole_prompts(stored, turns).select(found)
        joined = joined.hstack(whole.get_columns())
    return joined.with_columns(
        pl.lit(None, dtype).alias(name)
        for name, dtype in polars_schema(EXTRACTED_STEPS).items()
        if name in columns and name not in found
    )


def _by_turn(window: pl.LazyFrame, turn_ids: pl.Series, columns: list[str]) -> pl.DataFrame:
    """``columns`` of the turns in ``window`` named by ``turn_ids``, row for row (null where
    none is). A narrow read of the window's ids places each one first. When they are most of
    the window, the columns are read whole and gathered in place, or taken as read when they
    come in that order already (a batch in group order over ``Lake.scan_landed``: at 100k turns
    1.1 s and 1.0 GiB against 1.7 s and 1.5 GiB for the streaming match below, which also
    copied every token list). Otherwise the streaming engine matches the window to the ids
    and keeps only each morsel's matches: the whole window read for a tenth of it took
    900 MiB against 500."""
    placed = (
        window.select("turn_id")
        .with_row_index("_at")
        .collect(engine="in-memory")
        .unique("turn_id", keep="first", maintain_order=True)
    )
    at = (
        turn_ids.to_frame("turn_id")
        .join(placed, on="turn_id", how="left", maintain_order="left")
        .get_column("_at")
    )
    if 2 * at.drop_nulls().n_unique() >= placed.height:
        return rows_at(window.select(columns).collect(engine="in-memory"), at)
    matched = (
        keyed(window.select("turn_id", *columns), "turn_id", turn_ids)
        .collect(engine="streaming")
        .unique("turn_id", keep="first", maintain_order=True)
    )
    return (
        turn_ids.to_frame("turn_id")
        .join(matched, on="turn_id", how="left", maintain_order="left")
        .drop("turn_id")
    )


def rows_at(frame: pl.DataFrame, at: pl.Series) -> pl.DataFrame:
    """The rows of ``frame`` at positions ``at`` (a null position gives a null row). Positions
    that count up by one are a slice of ``frame``: taken as they are, no column copied."""
    first = at[0] if len(at) and at.null_count() == 0 else None
    if first is not None and at.equals(
        pl.int_range(first, first + len(at), dtype=at.dtype, eager=True)
    ):
        return frame.slice(first, len(at))
    return frame[at]


def started_within(started: pl.Series) -> pl.Expr:
    """``started_at`` within the range of ``started``, widened to whole milliseconds: Delta's
    file statistics keep timestamps to the millisecond (no bound when any is unknown)."""
    if started.null_count() or started.is_empty():
        return pl.lit(True)
    first, last = floor_ms(started.min()), started.max() + timedelta(milliseconds=1)
    return pl.col("started_at").is_between(
        pl.lit(first, started.dtype), pl.lit(last, started.dtype)
    )


Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)


def fit(frame: Frame, schema: pa.Schema) -> Frame:
    """``frame`` with exactly ``schema``'s columns, in order and type; absent columns are null.
    A column already of its type is taken as is: a cast to the same type still walks every
    chunk (a batch of 100k turns: 0.4-1.0 s for its 26 columns)."""
    present = frame.collect_schema()
    return frame.select(
        (pl.col(name) if present[name] == dtype else pl.col(name).cast(dtype))
        if name in present
        else pl.lit(None, dtype).alias(name)
        for name, dtype in polars_schema(schema).items()
    )


def conform(frame: pl.DataFrame | pl.LazyFrame, schema: pa.Schema) -> pa.Table:
    """Select the schema's columns in order and cast them to its exact Arrow types for writing."""
    if isinstance(frame, pl.LazyFrame):
        frame = frame.collect()
    missing = [name for name in schema.names if name not in frame.columns]
    if missing:
        raise ValueError(f"missing columns for {schema.names[:3]}...: {missing}")
    return frame.select(schema.names).to_arrow().cast(schema)
