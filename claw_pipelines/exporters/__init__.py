"""Exporters: write one planned batch in the trainers' own formats plus a manifest."""

from claw_pipelines.exporters.destination import Destination
from claw_pipelines.exporters.export import export_batch, export_chunks

__all__ = ["Destination", "export_batch", "export_chunks"]
