"""Lifecycle, reward, white-box step and policy endpoints on the proxy port (``/claw/v1/...``).

The HTTP edge (``asgi.CaptureApp``) authenticates them with the proxy key before they are
reached. Their bodies pass the same checks as a call's (``request_body``: size limit, depth,
finite numbers, valid Unicode) before FastAPI parses them. They land rows through the same spool
as the captured turns, so they share its durability: a 200 means the row is in this process's
spool and will reach Delta; a row the spool cannot take is a 503 with ``Retry-After``. The policy
routes (``policy.gate``) commit to Delta before answering, as other workers read them there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from claw_pipelines.capture.prompt_prefixes import land_turns
from claw_pipelines.capture.request_body import (
    BodyRejected,
    parse_json_object,
    read_body,
    replay,
)
from claw_pipelines.capture.runtime import CaptureRuntime
from claw_pipelines.identity import (
    IDENTITY_FIELDS,
    IdentityError,
    IdentityValue,
    PolicyVersion,
    TurnIdentity,
    identity_from_request,
)
from claw_pipelines.policy.gate import policy_router, with_announced_version
from claw_pipelines.redaction import NotSecret
from claw_pipelines.schemas import (
    Float32,
    Reward,
    RewardSource,
    TokenId,
    TrajectoryEventRow,
    Turn,
    new_id,
    utc_now,
)
from claw_pipelines.settings import get_settings
from claw_pipelines.spool.writer import SpoolUnavailable

MAX_TOKENS_PER_LIST = 1_000_000
Logprob = Annotated[Float32, Field(le=0)]


class CompleteTrajectory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: FiniteFloat | None = None
    status: Literal["completed", "aborted"] = "completed"
    group_id: IdentityValue | None = None
    metadata: dict[str, Any] | None = None


class RewardIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turn_id: IdentityValue | None = None
    trajectory_id: IdentityValue | None = None
    group_id: IdentityValue | None = None
    value: FiniteFloat
    name: Annotated[str, Field(min_length=1, max_length=128), NotSecret] = "reward"
    source: RewardSource = "env"
    metadata: dict[str, Any] | None = None


class StepIn(BaseModel):
    """A white-box step from an agent that tokenizes itself (token IDs are its engine's)."""

    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: Annotated[list[TokenId], Field(max_length=MAX_TOKENS_PER_LIST)]
    response_token_ids: Annotated[list[TokenId], Field(max_length=MAX_TOKENS_PER_LIST)]
    response_logprobs: Annotated[list[Logprob], Field(max_length=MAX_TOKENS_PER_LIST)] | None = None
    trajectory_id: IdentityValue | None = None
    group_id: IdentityValue | None = None
    channel: IdentityValue | None = None
    agent: IdentityValue | None = None
    policy_version: PolicyVersion | None = None
    model: Annotated[str, Field(min_length=1, max_length=256), NotSecret] = "white-box"
    messages: list[dict[str, Any]] | None = None
    response_text: str | None = None
    finish_reason: str | None = None
    metadata: dict[str, Any] | None = None


def _json_text(runtime: CaptureRuntime, value: object) -> str | None:
    """Scrubbed JSON text; ``allow_nan=False`` because stored JSON must be JSON (the body checks
    already refused non-finite numbers)."""
    if value is None:
        return None
    return json.dumps(runtime.redactor.data(value), ensure_ascii=False, allow_nan=False)


def white_box_turn(
    runtime: CaptureRuntime, body: StepIn, identity: TurnIdentity, at: datetime
) -> Turn:
    """The ``turns`` row of a white-box step (its version: the agent's, else the announced)."""
    identity = with_announced_version(identity, runtime.policy.state.version)
    message = {"role": "assistant", "content": body.response_text}
    return Turn(
        turn_id=new_id(),
        **identity.model_dump(),
        model=body.model,
        call_type="step",
        finish_reason=runtime.redactor.text(body.finish_reason) if body.finish_reason else None,
        token_source="engine",
        prompt_token_ids=body.prompt_token_ids,
        response_token_ids=body.response_token_ids,
        response_logprobs=body.response_logprobs,
        request_messages=_json_text(runtime, body.messages),
        response_message=_json_text(runtime, message),
        response_text=runtime.redactor.text(body.response_text) if body.response_text else None,
        started_at=at,
        ended_at=at,
        writer_id=runtime.writer.writer_id,
        metadata=_json_text(runtime, body.metadata),
    )


def invalid_request(errors: Sequence[Any], where: tuple[str, ...] = ()) -> JSONResponse:
    """A 400 listing each problem by field, the same for a body that does not parse and for a
    rule across fields (a reward's single target)."""
    problems = [{"loc": [*where, *e["loc"]], "msg": e["msg"]} for e in errors]
    return JSONResponse({"error": "invalid request", "problems": problems}, status_code=400)


class _CheckedBodies:
    """ASGI wrapper: a body ``request_body`` refuses gets its 413/400 before FastAPI parses it
    (FastAPI would take ``NaN``, any depth and any size); an accepted one is replayed."""

    def __init__(self, app: FastAPI, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body_bytes)
            if body is None:
                return
            parse_json_object(body)
        except BodyRejected as rejected:
            if rejected.status == 413:
                answer = JSONResponse({"error": rejected.message}, status_code=413)
            else:
                where = ("body", rejected.field) if rejected.field else ("body",)
                answer = invalid_request([{"loc": [], "msg": rejected.message}], where)
            await answer(scope, receive, send)
            return
        await self.app(scope, replay(body), send)


def build_control_app(max_body_bytes: int | None = None) -> _CheckedBodies:
    """The endpoints, behind the body checks (``max_body_bytes`` defaults to the settings')."""
    control = FastAPI(title="claw capture control", docs_url=None, redoc_url=None, openapi_url=None)

    @control.exception_handler(RequestValidationError)
    async def _invalid(_, error: RequestValidationError) -> JSONResponse:
        return invalid_request(error.errors())

    @control.exception_handler(SpoolUnavailable)
    async def _unavailable(_, error: SpoolUnavailable) -> JSONResponse:
        return JSONResponse({"error": error.message}, status_code=503, headers=error.headers)

    # `:path`: trajectory ids may contain "/" (a %2F-encoded base-URL prefix, an n > 1 choice).
    @control.post("/claw/v1/trajectories/{trajectory_id:path}/complete")
    async def complete(
        trajectory_id: IdentityValue, body: CompleteTrajectory | None = None
    ) -> dict[str, str]:
        """Every field is optional, so no body at all is a plain completion."""
        body = body or CompleteTrajectory()
        runtime = CaptureRuntime.current()
        row = TrajectoryEventRow(
            trajectory_id=trajectory_id,
            group_id=body.group_id,
            event=body.status,
            reward=body.reward,
            metadata=_json_text(runtime, body.metadata),
        )
        await runtime.land_durably([row])
        return {"event_id": row.event_id, "trajectory_id": trajectory_id, "status": body.status}

    @control.post("/claw/v1/rewards", response_model=None)
    async def reward(body: RewardIn) -> dict[str, str] | JSONResponse:
        runtime = CaptureRuntime.current()
        try:
            row = Reward(
                **body.model_dump(exclude={"metadata"}), metadata=_json_text(runtime, body.metadata)
            )
        except ValidationError as error:
            return invalid_request(error.errors(), ("body",))
        await runtime.land_durably([row])
        return {"reward_id": row.reward_id}

    @control.post("/claw/v1/steps")
    async def step(body: StepIn, request: Request, response: Response) -> dict[str, str]:
        """Identity comes as for a call: base-URL prefix or x-claw-* headers over body fields."""
        runtime = CaptureRuntime.current()
        if body.response_logprobs is not None and len(body.response_logprobs) != len(
            body.response_token_ids
        ):
            raise HTTPException(400, "response_logprobs must have one value per response token")
        try:
            identity = identity_from_request(
                request.headers, body.model_dump(include=set(IDENTITY_FIELDS))
            )
        except IdentityError as error:
            raise HTTPException(400, str(error)) from error
        row = white_box_turn(runtime, body, identity, utc_now())
        await land_turns(runtime, [row])
        response.headers["x-litellm-call-id"] = row.turn_id
        return {"turn_id": row.turn_id}

    @control.get("/claw/v1/status")
    async def status() -> dict[str, object]:
        runtime = CaptureRuntime.current()
        return {
            "writer_id": runtime.writer.writer_id,
            "spooled_rows": runtime.writer.spooled_rows(),
            "committed_rows": runtime.flusher.committed_rows,
        }

    control.include_router(policy_router(lambda: CaptureRuntime.current().policy))
    return _CheckedBodies(control, max_body_bytes or get_settings().max_body_bytes)
