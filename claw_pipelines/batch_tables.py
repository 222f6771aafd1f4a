"""Where a recipe's batches live in the lake: one place for the names the batch assets write and
trainers read (``claw_pipelines.trainer``), so neither guesses the other's layout."""

from __future__ import annotations

MANIFEST = "manifest.json"
"""Written last by an export, so a batch whose folder has it was exported in full."""


def ledger_table(recipe: str) -> str:
    """One row per step a batch of ``recipe`` reserved (the at-most-once guarantee)."""
    return f"batch_ledger/{recipe}"


def batches_table(recipe: str) -> str:
    """The framework-neutral rows of every batch of ``recipe``."""
    return f"batches/{recipe}"


def exports_folder(recipe: str) -> str:
    return f"exports/{recipe}"


def manifest_path(recipe: str, batch_id: str) -> str:
    return f"{exports_folder(recipe)}/{batch_id}/{MANIFEST}"


def consumption_table(recipe: str) -> str:
    """One row per batch a trainer (a named consumer) said it trained on."""
    return f"batch_consumption/{recipe}"
