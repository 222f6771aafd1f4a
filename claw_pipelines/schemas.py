"""The landing tables, declared once.

Each table is a pydantic model; its Arrow schema is derived from the model's annotations, so the
row validation at the boundary and the Delta schema can never disagree. JSON-valued columns
(messages, tool calls, metadata) are stored as JSON text: every engine that reads Delta can read
them, and their shape is free to evolve without a schema migration.
"""

from __future__ import annotations

import os
import time
import types
import uuid
from array import array
from datetime import UTC, datetime
from functools import cache
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import numpy as np
import polars as pl
import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictInt,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)


class ArrowType:
    """Annotation marker that pins a field's Arrow type (e.g. int32 token IDs)."""

    def __init__(self, arrow_type: pa.DataType) -> None:
        self.arrow_type = arrow_type


FLOAT32_MAX = 3.4028234663852886e38
TokenId = Annotated[StrictInt, Field(ge=0, lt=2**31)]
"""A vocabulary index as the engine returns it: stored as int32."""
Float32 = Annotated[FiniteFloat, Field(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
"""Stored as float32: a larger magnitude would land as an infinity."""


class TokenIdList(list):
    """Validated token IDs: a list that also keeps the int32 buffer its range check made, so
    the spool and capture's prefix memory use that buffer instead of converting a 50k-token
    prompt again (``int32``: little-endian bytes). A validated row's lists are not changed
    afterwards; a slice or a copy is a plain list."""

    __slots__ = ("int32",)


def _token_ids(value: Any, handler: ValidatorFunctionWrapHandler) -> list[int]:
    """Checks a list of token IDs as a whole: item by item, pydantic's range check cost ~70 ns
    a token (3.5 ms on a 50k-token prompt, on the proxy's request path). ``array`` refuses
    what is not an integer, below 0 or past 32 bits in one C loop; it takes ``True`` as 1, so
    the few items it read as 0 or 1 are looked at for booleans (a JSON ``true`` is not token 1).
    Anything else (not a list, or failing a check) is validated item by item, so its error
    names the first bad item. A ``TokenIdList`` was checked when it was made."""
    if type(value) is TokenIdList:
        return value
    if type(value) is not list:
        return handler(value)
    try:
        unsigned = array("I", value)
    except (TypeError, OverflowError):
        return handler(value)
    ids = np.frombuffer(unsigned, dtype=np.uint32)
    if unsigned and (ids.max() >= 2**31 or _has_booleans(value, ids)):
        return handler(value)
    tokens = TokenIdList(value)
    tokens.int32 = unsigned.tobytes()
    return tokens


def _has_booleans(values: list, ids: np.ndarray) -> bool:
    """Whether any of ``values`` that ``ids`` (their ``array`` conversion) holds as 0 or 1 is a
    bool."""
    return any(type(values[index]) is bool for index in np.flatnonzero(ids <= 1).tolist())


TokenIds = Annotated[list[TokenId], WrapValidator(_token_ids), ArrowType(pa.list_(pa.int32()))]
Logprobs = Annotated[list[Float32], ArrowType(pa.list_(pa.float32()))]
Int32 = Annotated[int, Field(ge=-(2**31), lt=2**31), ArrowType(pa.int32())]
JsonText = Annotated[str, ArrowType(pa.string())]
SharedSpan = Annotated[
    list[Annotated[StrictInt, Field(ge=0, lt=2**31)]],
    Field(min_length=2, max_length=2),
    ArrowType(pa.list_(pa.int32())),
]
"""[head, tail]: characters a text shares with the same column of the referenced turn."""
UtcTimestamp = Annotated[datetime, ArrowType(pa.timestamp("us", tz="UTC"))]

TokenSource = Literal["engine", "retokenized", "none"]
AgentApi = Literal["chat", "completions", "responses", "messages"]
TurnStatus = Literal["success", "error"]
RewardSource = Literal["rule", "model", "human", "env"]
TrajectoryEvent = Literal["completed", "aborted"]
LabelTarget = Literal["step", "trajectory"]
PolicyEventKind = Literal["announce", "pause"]

_PLAIN_ARROW_TYPES: dict[type, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    datetime: pa.timestamp("us", tz="UTC"),
}


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    """A time-ordered unique id in the UUIDv7 layout, so ids sort by creation time."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (
        (millis << 80)
        | (0x7 << 76)
        | ((rand >> 62) & 0xFFF) << 64
        | (0b10 << 62)
        | (rand & (2**62 - 1))
    )
    return str(uuid.UUID(int=value))


def _arrow_type(annotation: Any, metadata: list[Any]) -> tuple[pa.DataType, bool]:
    """Map a field annotation to (Arrow type, nullable)."""
    nullable = False
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        nullable = len(members) < len(get_args(annotation))
        (annotation,) = members
    if get_origin(annotation) is Annotated:
        annotation, *extra = get_args(annotation)
        metadata = [*metadata, *extra]
    for marker in metadata:
        if isinstance(marker, ArrowType):
            return marker.arrow_type, nullable
    if get_origin(annotation) is Literal:
        return pa.string(), nullable
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return pa.list_(_PLAIN_ARROW_TYPES[item]), nullable
    return _PLAIN_ARROW_TYPES[annotation], nullable


class LandingRow(BaseModel):
    """Base of every landing-table row: validated at the boundary, strict about unknown keys."""

    model_config = ConfigDict(extra="forbid")
    table_name: ClassVar[str]
    key: ClassVar[str]
    closes: ClassVar[bool] = False
    """Whether the row ends something a batch waits for (a trajectory's completion or abort, a
    reward): the proxy commits it at once, with everything spooled before it."""

    @classmethod
    def arrow_schema(cls) -> pa.Schema:
        return _arrow_schema_of(cls)


@cache
def _arrow_schema_of(model: type[LandingRow]) -> pa.Schema:
    """Derived once per model: the spool calls this for every row it writes."""
    fields = []
    for name, info in model.model_fields.items():
        arrow_type, nullable = _arrow_type(info.annotation, list(info.metadata))
        fields.append(pa.field(name, arrow_type, nullable=nullable))
    return pa.schema(fields)


class Turn(LandingRow):
    """One LLM call as the proxy saw it: identity, request, response and exact engine token IDs."""

    table_name: ClassVar[str] = "turns"
    key: ClassVar[str] = "turn_id"

    turn_id: str = Field(
        description="LiteLLM call id; also returned to the agent as x-litellm-call-id."
    )
    trajectory_id: str | None = None
    group_id: str | None = None
    channel: str | None = None
    agent: str | None = None
    policy_version: int | None = None
    model: str
    backend: str | None = Field(default=None, description="Provider and api_base that answered.")
    call_type: Literal["chat", "completion", "step"] = "chat"
    api: AgentApi | None = Field(
        default=None,
        description="The API the agent spoke (a Responses or Messages call bridged to the "
        "engine's chat call keeps its own); None for white-box steps and older rows.",
    )
    api_request: JsonText | None = Field(
        default=None,
        description="Responses and Messages calls: the request body in that API's own shape "
        "(scrubbed JSON). Chat and completion calls keep theirs in request_messages et al.",
    )
    api_response: JsonText | None = Field(
        default=None,
        description="Responses and Messages calls: the answer in that API's own shape (JSON; "
        "for a stream, the complete answer it carried; null for a passthrough stream through "
        "the bridge, whose events are made after the turn is spooled).",
    )
    stream: bool = False
    status: TurnStatus = "success"
    error: str | None = None
    finish_reason: str | None = None
    token_source: TokenSource = "none"
    prompt_token_ids: TokenIds | None = Field(
        default=None,
        description="The prompt's engine IDs; with prompt_prefix_len set, only those after it.",
    )
    prompt_prefix_turn_id: str | None = Field(
        default=None,
        description="The earlier turn of this trajectory, spooled before by the same proxy "
        "process, that prompt_prefix_len and the *_shared columns refer to; null: every "
        "column is stored whole (``turn_prompts`` rebuilds them).",
    )
    prompt_prefix_len: Int32 | None = Field(
        default=None,
        description="How many tokens of the referenced turn's prompt + response IDs this "
        "prompt starts with; prompt_token_ids holds the rest. Null: stored whole.",
    )
    prompt_len: Int32 | None = Field(
        default=None, description="The whole prompt's length: a rebuilt prompt must have it."
    )
    response_token_ids: TokenIds | None = None
    response_logprobs: Logprobs | None = None
    request_messages: JsonText | None = Field(
        default=None, description="JSON list of chat messages."
    )
    request_tools: JsonText | None = None
    request_messages_shared: SharedSpan | None = Field(
        default=None,
        description="[head, tail]: request_messages is the referenced turn's text with its "
        "middle replaced: its first head and last tail characters are not stored. Null: whole.",
    )
    request_tools_shared: SharedSpan | None = Field(
        default=None, description="As request_messages_shared, for request_tools."
    )
    api_request_shared: SharedSpan | None = Field(
        default=None, description="As request_messages_shared, for api_request."
    )
    sampling_params: JsonText | None = None
    response_message: JsonText | None = Field(
        default=None, description="JSON assistant message: role, content, tool_calls."
    )
    response_text: str | None = None
    prompt_tokens: Int32 | None = None
    completion_tokens: Int32 | None = None
    started_at: UtcTimestamp
    ended_at: UtcTimestamp
    first_token_at: UtcTimestamp | None = None
    latency_ms: float | None = None
    writer_id: str | None = Field(
        default=None, description="Spool writer (process) that landed it."
    )
    metadata: JsonText | None = None


class Reward(LandingRow):
    """A reward or feedback value that may arrive long after the turn it scores."""

    table_name: ClassVar[str] = "rewards"
    key: ClassVar[str] = "reward_id"
    closes: ClassVar[bool] = True

    reward_id: str = Field(default_factory=new_id)
    turn_id: str | None = None
    trajectory_id: str | None = None
    group_id: str | None = None
    value: FiniteFloat
    name: str = "reward"
    source: RewardSource = "env"
    created_at: UtcTimestamp = Field(default_factory=utc_now)
    metadata: JsonText | None = None

    @model_validator(mode="after")
    def _one_target(self) -> Reward:
        targets = [t for t in (self.turn_id, self.trajectory_id, self.group_id) if t]
        if len(targets) != 1:
            raise ValueError("a reward targets exactly one of turn_id, trajectory_id, group_id")
        return self


class TrajectoryEventRow(LandingRow):
    """A trajectory lifecycle event: completed or aborted, optionally with the outcome reward."""

    table_name: ClassVar[str] = "trajectory_events"
    key: ClassVar[str] = "event_id"
    closes: ClassVar[bool] = True

    event_id: str = Field(default_factory=new_id)
    trajectory_id: str
    group_id: str | None = None
    event: TrajectoryEvent = "completed"
    reward: FiniteFloat | None = None
    created_at: UtcTimestamp = Field(default_factory=utc_now)
    metadata: JsonText | None = None


class TrajectoryRegistration(LandingRow):
    """What an agent declared about a trajectory (Claw-R1's ``register_trajectory``): its channel,
    the task's ground truth and data source for the rule rewards, and free metadata. It may land
    before or after the trajectory's turns; the latest one per trajectory counts."""

    table_name: ClassVar[str] = "trajectory_registrations"
    key: ClassVar[str] = "registration_id"

    registration_id: str = Field(default_factory=new_id)
    trajectory_id: str
    group_id: str | None = None
    channel: str | None = None
    ground_truth: str | None = None
    data_source: str | None = None
    created_at: UtcTimestamp = Field(default_factory=utc_now)
    metadata: JsonText | None = None


class Label(LandingRow):
    """A human curation decision; the latest label per target wins, history is kept."""

    table_name: ClassVar[str] = "labels"
    key: ClassVar[str] = "label_id"

    label_id: str = Field(default_factory=new_id)
    target_kind: LabelTarget
    target_id: str = Field(description="turn_id for a step, trajectory_id for a trajectory.")
    quality_label: str | None = None
    trainable: bool | None = None
    tags: list[str] | None = None
    note: str | None = None
    author: str = "unknown"
    created_at: UtcTimestamp = Field(default_factory=utc_now)


class PolicyEvent(LandingRow):
    """A trainer's word to the proxies: the policy version now served, or a pause for a weight
    sync (held until the next announce). The newest event decides (``policy_versions``)."""

    table_name: ClassVar[str] = "policy_versions"
    key: ClassVar[str] = "event_id"

    event_id: str = Field(default_factory=new_id)
    event: PolicyEventKind
    version: int | None = Field(
        default=None, description="Announced version; for a pause, the version it paused."
    )
    created_at: UtcTimestamp = Field(default_factory=utc_now)
    writer_id: str | None = Field(default=None, description="Proxy worker that recorded it.")


LANDING_MODELS: dict[str, type[LandingRow]] = {
    model.table_name: model
    for model in (Turn, Reward, TrajectoryEventRow, TrajectoryRegistration, Label, PolicyEvent)
}


def rows_to_arrow(model: type[LandingRow], rows: list[dict[str, Any]]) -> pa.Table:
    """An Arrow table of validated rows (as dumped by ``model_dump``) in the model's schema."""
    return arrow_rows(rows, model.arrow_schema())


def arrow_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """``rows`` (Python values) as an Arrow table of ``schema``, converted by polars: pyarrow's
    own conversion imports pandas, which costs a proxy a fifth of a second of CPU at its first
    policy event or maintenance lease, and 32k more objects for every full garbage collection
    from then on."""
    return pl.DataFrame(rows, schema=polars_schema(schema)).to_arrow().cast(schema)


def polars_schema(schema: pa.Schema) -> pl.Schema:
    """The polars schema of an Arrow schema (for empty frames and casts)."""
    return empty(schema).schema


def empty(schema: pa.Schema) -> pl.DataFrame:
    """An empty frame with the table's columns, so "nothing new" flows through every transform.
    (Not ``Schema.empty_table``: it imports pandas, a good part of a short run.)"""
    return pl.from_arrow(pa.Table.from_batches([], schema=schema))  # type: ignore[return-value]
