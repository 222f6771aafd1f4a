"""The ``claw_compat.claw_r1`` block of the LiteLLM config, and what it adds to the config.

``claw proxy --compat claw-r1`` switches the block on in the config the proxy runs with (the
block may also be switched on in the config itself). Rendering an enabled block adds what
LiteLLM itself must know:

- the model aliases, as ``router_settings.model_group_alias`` entries to the default model,
  hidden from ``/v1/models`` (LiteLLM's router resolves them; Claw-R1 agents send ``default``);
- for a vLLM-protocol default model (``hosted_vllm/``), its token-prompt twin
  ``<default>-token-prompts`` (``edge.token_prompts``), which Claw-R1's ``/generate`` calls
  with token IDs.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from claw_pipelines.edge.token_prompts import token_prompt_twin

BIND_HOST_ENV = "CLAW_PROXY_HOST"
"""The interface ``claw proxy`` binds, set by the launcher; unset counts as not loopback."""
COMPAT_BLOCK = "claw_compat"
COMPAT_NAME = "claw-r1"
"""The value of ``claw proxy --compat``."""
HERMES_LAYOUT = "<tool_call>\n{call}\n</tool_call>"
"""How Qwen2.5/Qwen3 (Hermes-style) chat templates write a tool call in the token stream."""


class ClawR1Settings(BaseModel):
    """Claw-R1's gateway protocol on the proxy port (docs/claw-r1.md)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    default_model: str = Field(default="policy", description="The model the aliases route to.")
    model_aliases: list[str] = Field(
        default=["default"], description="Model names agents send that mean the default model."
    )
    keyless_on_loopback: bool = Field(
        default=True,
        description="On a loopback bind, take Claw-R1 routes without the proxy key (its agents "
        "send none, or 'not-needed'); any other bind always needs the key.",
    )
    response_length: int = Field(
        default=4096, ge=1, description="/generate's max_tokens when sampling_params has none."
    )
    tool_call_layouts: dict[str, str] = Field(
        default_factory=dict,
        description="Upstream model (litellm_params.model) -> how it writes a tool call, with "
        "{call} for the call's JSON; others use the Hermes layout.",
    )

    @field_validator("tool_call_layouts")
    @classmethod
    def _has_call(cls, layouts: dict[str, str]) -> dict[str, str]:
        missing = sorted(model for model, layout in layouts.items() if "{call}" not in layout)
        if missing:
            raise ValueError(f"tool call layouts without {{call}}: {', '.join(missing)}")
        return layouts


def compat_settings(config: dict[str, Any]) -> ClawR1Settings:
    return ClawR1Settings.model_validate((config.get(COMPAT_BLOCK) or {}).get("claw_r1") or {})


def with_claw_r1(config: dict[str, Any], enable: bool) -> dict[str, Any]:
    """``config`` with the block switched on when ``enable``; an enabled block's aliases and
    token-prompt twin added (see the module docstring). The input is not changed."""
    config = copy.deepcopy(config)
    settings = compat_settings(config)
    if enable:
        settings = settings.model_copy(update={"enabled": True})
        config.setdefault(COMPAT_BLOCK, {})["claw_r1"] = settings.model_dump()
    if not settings.enabled:
        return config
    models = config.setdefault("model_list", [])
    names = {str(entry.get("model_name")) for entry in models}
    if settings.default_model not in names:
        raise ValueError(
            f"claw_compat.claw_r1.default_model {settings.default_model!r} is not in model_list"
        )
    router = config.setdefault("router_settings", {})
    aliases = router.setdefault("model_group_alias", {})
    for alias in settings.model_aliases:
        if alias not in names and alias not in aliases:
            aliases[alias] = {"model": settings.default_model, "hidden": True}
    twin = _token_prompt_twin(models, settings.default_model)
    if twin is not None and twin["model_name"] not in names:
        models.append(twin)
    return config


def _token_prompt_twin(models: list[dict[str, Any]], default_model: str) -> dict[str, Any] | None:
    (entry,) = [e for e in models if e.get("model_name") == default_model]
    return token_prompt_twin(entry)
