"""Claw-R1's gateway bodies (``claw_r1/gateway/models.py`` and its register route), as we take them.

The fields are Claw-R1's, with its defaults, so every body its agents send is accepted; an
unknown field is a 400 naming it (a typo would otherwise be dropped silently). What we cannot
keep is refused rather than dropped: multimodal data, MoE routing and images or video.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from claw_pipelines.edge.control import MAX_TOKENS_PER_LIST, Logprob, TokenId
from claw_pipelines.identity import IdentityValue, PolicyVersion

DEFAULT_CHANNEL = "train"
TokenList = Annotated[list[TokenId], Field(max_length=MAX_TOKENS_PER_LIST)]
OptionalUid = IdentityValue | Literal[""]
"""Claw-R1 defaults a step's uids to "" (no identity: the trajectory is inferred)."""
_VERSION = TypeAdapter(PolicyVersion | None)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _refuse(value: object, field: str, why: str) -> None:
    if value is not None:
        raise ValueError(f"{field} is not supported: {why}; send null")


class RegisterTrajectory(_Body):
    """``POST /{t}/{p}/v1/register_trajectory``: kept for the trajectory (every field optional)."""

    channel: IdentityValue = DEFAULT_CHANNEL
    metadata: dict[str, Any] | None = None

    @property
    def policy_version(self) -> int | None:
        """``metadata.policy_version``, which Claw-R1 stamps on the trajectory's steps."""
        return _VERSION.validate_python((self.metadata or {}).get("policy_version"))

    @model_validator(mode="after")
    def _policy_version_is_a_version(self) -> RegisterTrajectory:
        try:
            self.policy_version  # noqa: B018 (validates)
        except ValidationError as error:
            raise ValueError(f"metadata.policy_version: {error.errors()[0]['msg']}") from None
        return self


def declared_task(metadata: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(ground truth, data source) as text: ``ground_truth`` as Claw-R1's docs send it, else
    ``reward_model.ground_truth`` as its agent flow forwards a verl dataset row."""
    metadata = metadata or {}
    truth = metadata.get("ground_truth")
    reward_model = metadata.get("reward_model")
    if truth is None and isinstance(reward_model, dict):
        truth = reward_model.get("ground_truth")
    return _text(truth), _text(metadata.get("data_source"))


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class CompleteTrajectory(_Body):
    """``POST /{t}/{p}/v1/complete_trajectory`` (the body is optional)."""

    reward: FiniteFloat | None = None
    channel: IdentityValue = DEFAULT_CHANNEL


class InitTrajectoryAnswer(BaseModel):
    trajectory_uid: str
    base_url: str


class StepPayload(_Body):
    """One white-box step of ``POST /submit_steps``."""

    prompt_ids: TokenList
    response_ids: TokenList
    multi_modal_data: dict[str, Any] | None = None
    reward: FiniteFloat | None = None
    rollout_log_probs: Annotated[list[Logprob], Field(max_length=MAX_TOKENS_PER_LIST)] | None = None
    routed_experts: Any = None
    trajectory_uid: OptionalUid = ""
    prompt_uid: OptionalUid = ""
    step_index: int = Field(default=0, ge=0)
    policy_version: PolicyVersion = 0
    is_last: bool = False
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _storable(self) -> StepPayload:
        _refuse(self.multi_modal_data, "multi_modal_data", "steps are text-only here")
        _refuse(self.routed_experts, "routed_experts", "MoE routing is not stored")
        logprobs = self.rollout_log_probs
        if logprobs is not None and len(logprobs) != len(self.response_ids):
            raise ValueError("rollout_log_probs must have one value per response token")
        if not isinstance((self.metadata or {}).get("claw", {}), dict):
            raise ValueError("metadata.claw must be a JSON object")
        return self


class SubmitSteps(_Body):
    steps: Annotated[list[StepPayload], Field(min_length=1)]


class SubmitStepsAnswer(BaseModel):
    accepted: int


class GenerateRequest(_Body):
    """``POST /generate``: token IDs in. The uids are optional (its docs send them, its code
    has none); with them the turn lands in that trajectory and group."""

    prompt_ids: Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKENS_PER_LIST)]
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    image_data: list[Any] | None = None
    video_data: list[Any] | None = None
    trajectory_uid: IdentityValue | None = None
    prompt_uid: IdentityValue | None = None

    @model_validator(mode="after")
    def _text_only(self) -> GenerateRequest:
        _refuse(self.image_data, "image_data", "the prompt is token IDs only")
        _refuse(self.video_data, "video_data", "the prompt is token IDs only")
        return self


class GenerateAnswer(BaseModel):
    """Token IDs out: the engine's own (Claw-R1 re-encodes the text instead)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None
