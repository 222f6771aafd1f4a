"""The Delta Lake tables under one root: ``Lake`` locates, creates and opens them
(``tables``) with their ``properties``; rows are written by ``commits.commit`` alone;
``changes`` reads what commits added, ``files`` and ``filters`` read only what a reader
needs, and ``store`` makes commits safe for many writers."""

from claw_pipelines.lake.tables import Lake

__all__ = ["Lake"]
