"""Every relative link and anchor in README.md and docs/ resolves, and every marker is known."""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_blocks import REPO, anchors, blocks, links, pages


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(REPO)}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_markers_are_known(page: Path) -> None:
    for block in blocks(page):
        block.skip_reason  # noqa: B018 (raises on a marker the docs test does not know)
