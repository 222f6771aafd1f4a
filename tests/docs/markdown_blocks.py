"""The pages the docs tests read, their fenced code blocks with markers, and their links."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNABLE = {"bash": "shell", "sh": "shell", "python": "python"}
"""Fence languages the docs test runs, and how."""

FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip \((.+)\)$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    """README.md first (its tour runs first), then every page under docs/ by name."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """1-based line of the opening fence."""
    language: str
    code: str
    marker: str | None
    """The text of a ``<!-- docs-test: … -->`` comment on the line before the fence."""

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker is None or self.marker == "needs stack":
            return None
        skip = SKIP.match(self.marker)
        if skip is None:
            raise ValueError(f"{self.name}: unknown docs-test marker {self.marker!r}")
        return skip.group(1)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the marker just above it (blank lines between)."""
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(
            (i for i in range(index + 1, len(lines)) if lines[i].strip() == fence.group(1)),
            None,
        )
        if end is None:
            raise ValueError(f"{page.name}:{index + 1}: fence never closed")
        above = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = MARKER.match(above)
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(
            Block(page, index + 1, fence.group(2), code, marker.group(1) if marker else None)
        )
        index = end + 1
    return found


def prose(page: Path) -> str:
    """``page`` without its fenced blocks (links in code are not links)."""
    kept, fence = [], None
    for line in page.read_text().splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            kept.append(line)
    return "\n".join(kept)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"[`*]", "", heading).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page`` (repeats get GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    for line in prose(page).splitlines():
        heading = HEADING.match(line)
        if heading:
            slug = anchor(heading.group(2))
            seen[slug] = seen.get(slug, -1) + 1
    return {f"{slug}-{i}" if i else slug for slug, n in seen.items() for i in range(n + 1)}


def links(page: Path) -> list[str]:
    """Relative link targets in ``page``'s prose (web and mail addresses left out)."""
    return [
        target
        for target in LINK.findall(prose(page))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)
    ]
