"""claw-pipelines: the step-level data middleware for agentic RL."""

__version__ = "0.1.0"
