"""Dagster resources and service configuration (LiteLLM, Dagster instance) for claw_pipelines."""
