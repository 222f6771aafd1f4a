"""The YAML configuration shipped in ``assets/`` (recipes, reward rules, quality weights).

The files sit beside the Dagster definitions that use them; they are found without importing
that package, so the inspector and ``claw up`` read them without loading the code location.
"""

from __future__ import annotations

from functools import cache
from importlib.util import find_spec
from pathlib import Path

from claw_pipelines.batching.recipe import Recipe, load_recipes
from claw_pipelines.transforms.quality import QualityConfig
from claw_pipelines.transforms.reward_rules import RewardConfig


def _config_dir() -> Path:
    spec = find_spec("assets")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the 'assets' package (assets/batches.yaml) is not importable")
    return Path(next(iter(spec.submodule_search_locations)))


CONFIG_DIR = _config_dir()
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
