"""Where a recipe's batches live in the lake: the one place for the names the batch assets
write and trainers and the inspector read, so none guesses another's layout."""

from __future__ import annotations

MANIFEST = "manifest.json"
"""Written last by an export, so a batch whose folder has it was exported in full."""


def ledger_table(recipe: str) -> str:
    """One row per step a batch of ``recipe`` reserved (the at-most-once guarantee)."""
    return f"batch_ledger/{recipe}"


def batches_table(recipe: str) -> str:
    """The framework-neutral rows of every batch of ``recipe``."""
    return f"batches/{recipe}"


def retired_table(recipe: str) -> str:
    """The steps ``recipe``'s plans dropped for good (``batching.retirements``)."""
    return f"batch_retired/{recipe}"


def consumption_table(recipe: str) -> str:
    """One row per batch a trainer (a named consumer) said it trained on."""
    return f"batch_consumption/{recipe}"


def exports_folder(recipe: str) -> str:
    return f"exports/{recipe}"


def export_folder(recipe: str, batch_id: str) -> str:
    """The folder of one batch's export files and manifest."""
    return f"{exports_folder(recipe)}/{batch_id}"


def manifest_path(recipe: str, batch_id: str) -> str:
    return f"{export_folder(recipe, batch_id)}/{MANIFEST}"
