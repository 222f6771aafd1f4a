"""Pure polars transforms of the pipeline; Dagster assets only wire these."""

from claw_pipelines.transforms.credit import CreditAssignment, assign_credit
from claw_pipelines.transforms.curation import curate_steps
from claw_pipelines.transforms.quality import QualityConfig, score_steps
from claw_pipelines.transforms.rewards import affected_trajectories, reward_steps
from claw_pipelines.transforms.steps import StepExtraction, extract_steps
from claw_pipelines.transforms.trajectories import summarize_trajectories

__all__ = [
    "CreditAssignment",
    "QualityConfig",
    "StepExtraction",
    "affected_trajectories",
    "assign_credit",
    "curate_steps",
    "extract_steps",
    "reward_steps",
    "score_steps",
    "summarize_trajectories",
]
