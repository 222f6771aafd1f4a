"""``manifest.json``: what an export of one batch wrote, read by trainers (``trainer.Batch``)
and written last by the exporters, so a folder with it holds a whole export."""

from __future__ import annotations

from typing import Literal

from deltalake.fs import DeltaStorageHandler
from pydantic import BaseModel, ConfigDict, Field

from claw_pipelines.batches.names import manifest_path
from claw_pipelines.batches.pins import Pins
from claw_pipelines.lake import Lake

Truncation = Literal["error", "left", "right"]


class VerlLayout(BaseModel):
    """How a batch's rows become fixed-width arrays."""

    model_config = ConfigDict(extra="forbid")

    prompt_length: int | None = Field(default=None, ge=1)
    response_length: int | None = Field(default=None, ge=1)
    pad_token_id: int = Field(default=0, ge=0)
    truncation: Truncation = "error"
    pad_to_multiple: int = Field(default=1, ge=1)


class ExportedFile(BaseModel):
    path: str
    format: str
    rows: int
    description: str


class ModelRows(BaseModel):
    model: str | None
    """The model that answered, as the engine named it: its tokenizer made the token IDs (vLLM
    serves the model's own tokenizer unless started with ``--tokenizer``)."""
    rows: int


class Manifest(BaseModel):
    recipe: str
    algorithm: str
    batch_id: str
    layout: str = "step"
    """``sequence``: a row per segment of a trajectory; ``step``: a row per step (every batch
    exported before layouts existed)."""
    rows: int
    source_versions: dict[str, int]
    planned_with: Pins | None = None
    """The batch's pins: with the lake at hand, enough to plan the batch again."""
    models: list[ModelRows] = []
    """Which models' token IDs the batch holds (one, unless the policy changed mid-batch)."""
    tokenizer: str | None = None
    """The tokenizer that made every token ID of the batch: the one model that answered (null
    when models changed mid-batch: then each row's ``tokenizer`` says)."""
    verl_layout: VerlLayout | None = None
    """The widths and pad id of the verl tensors (widths null: each batch's longest row)."""
    files: list[ExportedFile]

    @classmethod
    def read(cls, lake: Lake, recipe: str, batch_id: str) -> Manifest:
        """The manifest of an exported batch (``FileNotFoundError``: not exported in full)."""
        store = DeltaStorageHandler(lake.root_uri, lake.storage_options or None)
        with store.open_input_file(manifest_path(recipe, batch_id)) as file:
            return cls.model_validate_json(file.read())
