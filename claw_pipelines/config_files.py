"""The YAML configuration: which file of each name is read, and the parsed recipes, rewards and
quality settings.

The defaults ship as package data (``importlib.resources``), so an installed wheel finds them
as a checkout does: ``assets/`` holds the recipes, reward rules and quality weights beside the
Dagster definitions that use them, ``resources/`` the LiteLLM and Dagster instance configs.
A directory the user names (``CLAW_CONFIG_DIR``, ``claw up --config-dir``) overrides them file
by file: a file of the same name there is read instead of the shipped one.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from claw_pipelines.batches.recipe import Recipe, load_recipes
from claw_pipelines.settings import get_settings
from claw_pipelines.transforms.quality import QualityConfig
from claw_pipelines.transforms.reward_rules import RewardConfig

SHIPPED_IN = {
    "batches.yaml": "assets",
    "rewards.yaml": "assets",
    "quality.yaml": "assets",
    "litellm.yaml": "resources",
    "dagster.yaml": "resources",
}
"""Each configuration file and the package it ships in."""


def shipped_file(name: str) -> Path:
    """The default ``name`` as installed (a plain file: pip and uv unpack wheels)."""
    shipped = files(SHIPPED_IN[name]) / name
    if not isinstance(shipped, Path):
        raise FileNotFoundError(f"{name} is inside an archive ({shipped}); install unpacked")
    return shipped


def config_file(name: str) -> Path:
    """``name`` from the user's config directory when it holds one, else the shipped one."""
    override = get_settings().config_dir
    if override is not None and (override / name).is_file():
        return override / name
    return shipped_file(name)


@cache
def recipes() -> dict[str, Recipe]:
    return load_recipes(config_file("batches.yaml"))


@cache
def reward_config() -> RewardConfig:
    return RewardConfig.from_yaml(config_file("rewards.yaml"))


@cache
def quality_config() -> QualityConfig:
    return QualityConfig.from_yaml(config_file("quality.yaml"))
