"""A destination's text file (a batch's manifest, which says its export is finished) appears
whole or not at all: a trainer polling for it must never read it half written."""

from __future__ import annotations

from pathlib import Path

import pytest

from claw_pipelines.exporters import destination
from claw_pipelines.exporters.destination import Destination


def test_text_is_not_visible_until_written_whole(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "batches" / "grpo" / "b1" / "manifest.json"
    seen_while_writing = []
    write = destination.ByteStream.write

    def spy(self, data: bytes) -> int:
        seen_while_writing.append(target.exists())
        return write(self, data)

    monkeypatch.setattr(destination.ByteStream, "write", spy)
    text = '{"batch_id": "b1"}' * 1000
    Destination(str(tmp_path)).text(text, "batches/grpo/b1/manifest.json")
    assert seen_while_writing == [False]
    assert target.read_text() == text
    assert sorted(p.name for p in target.parent.iterdir()) == ["manifest.json"]


@pytest.mark.parametrize("size", [0, destination.STREAM_BUFFER + 1])
def test_text_of_any_size(tmp_path: Path, size: int) -> None:
    Destination(str(tmp_path)).text("x" * size, "m.json")
    assert (tmp_path / "m.json").read_text() == "x" * size
