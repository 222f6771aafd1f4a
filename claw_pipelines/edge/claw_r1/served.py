"""What the running proxy knows of an enabled ``claw_compat.claw_r1`` block (``config``)."""

from __future__ import annotations

from pathlib import Path

import yaml
from litellm.router_utils.common_utils import resolve_model_group_alias
from pydantic import BaseModel

from claw_pipelines.edge.claw_r1.config import (
    HERMES_LAYOUT,
    ClawR1Settings,
    compat_settings,
)
from claw_pipelines.edge.token_prompts import TOKEN_PROMPT_SUFFIX


class ClawR1Config(BaseModel):
    """What the running proxy needs of the block: settings, and per served model name (aliases
    included) the tool call layout of the model behind it."""

    settings: ClawR1Settings
    layouts: dict[str, str]
    generate_model: str | None
    """The token-prompt twin ``/generate`` calls; None when the default model has none."""

    def layout_for(self, model: str) -> str:
        return self.layouts.get(model, HERMES_LAYOUT)

    @classmethod
    def load(cls, config_path: str | None) -> ClawR1Config | None:
        """The enabled block of the config the proxy runs with, or None."""
        if not config_path or not Path(config_path).is_file():
            return None
        config = yaml.safe_load(Path(config_path).read_text()) or {}
        settings = compat_settings(config)
        if not settings.enabled:
            return None
        upstream = {
            str(entry["model_name"]): str((entry.get("litellm_params") or {}).get("model", ""))
            for entry in config.get("model_list") or []
        }
        aliases = (config.get("router_settings") or {}).get("model_group_alias") or {}
        for alias in aliases:
            target = resolve_model_group_alias(aliases, alias)
            if target in upstream:
                upstream.setdefault(str(alias), upstream[target])
        layouts = {
            name: settings.tool_call_layouts.get(model, HERMES_LAYOUT)
            for name, model in upstream.items()
        }
        twin = settings.default_model + TOKEN_PROMPT_SUFFIX
        return cls(
            settings=settings, layouts=layouts, generate_model=twin if twin in upstream else None
        )
