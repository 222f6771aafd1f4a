"""Dagster assets, checks and sensors: thin wrappers over claw_pipelines transforms."""
