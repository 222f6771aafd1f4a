"""The YAML configuration shipped next to the assets (recipes, reward rules, quality weights)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from claw_pipelines.recipes import Recipe, load_recipes
from claw_pipelines.reward_rules import RewardConfig
from claw_pipelines.transforms.quality import QualityConfig

CONFIG_DIR = Path(__file__).parent
RECIPES_FILE = CONFIG_DIR / "batches.yaml"


@cache
def recipes() -> dict[str, Recipe]:
    return load_recipes(RECIPES_FILE)


@cache
def reward_config() -> RewardConfig:
    return RewardConfig.from_yaml(CONFIG_DIR / "rewards.yaml")


@cache
def quality_config() -> QualityConfig:
    return QualityConfig.from_yaml(CONFIG_DIR / "quality.yaml")
