"""Docs that run: every shell and Python block of README.md and docs/ is executed against a real
stack, so the pages cannot drift from the code.

Conventions in the markdown:

- A fenced block in ``bash``/``sh`` runs with ``bash -e -o pipefail``, one in ``python`` with the
  repository's ``.venv/bin/python``; other languages are not run, except that a ``yaml`` block
  starting with ``recipes:`` must load as recipes.
- Each runs in a folder that looks like a checkout after ``make up``: ``.venv``, ``assets/``,
  ``resources/``, ``bench/``, ``workspace.yaml`` and ``dagster.yaml`` are linked in, ``.claw/``
  is the live stack's (lake, Dagster instance), ``.venv/bin`` is first on ``PATH``.
- The stack is one ``claw up`` for the whole session on free loopback ports, with ``claw demo``
  traffic and a first exported GRPO batch (``conftest.py``). ``make up``'s addresses
  (``127.0.0.1:4000``, ``:3000``, ``:8120``, ``:8001``) in a block are pointed at its ports, and
  ``CLAW_PROXY_URL`` names its proxy for ``claw demo``.
- Blocks run in page order, README.md first, so a block may use what an earlier one of its page
  made.
- An HTML comment on the line before a fence (blank lines between allowed) marks it:
  ``<!-- docs-test: needs stack -->`` says it runs against the stack (the default, stated where
  a reader may wonder); ``<!-- docs-test: skip (reason) -->`` skips it, with the reason shown
  (needs a GPU server, a real vLLM, an S3 bucket, or it starts the stack itself). Any other
  marker fails ``test_docs_links.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from docs_stack import DocsStack
from markdown_blocks import RUNNABLE, Block, blocks, pages

from claw_pipelines.batches.recipe import Recipe

BLOCK_TIMEOUT_S = 600
pytestmark = pytest.mark.timeout(1200)
"""The first block that runs also pays for the session's stack (claw up, demo, first batch)."""


def _runnable() -> list[Block]:
    return [block for page in pages() for block in blocks(page) if block.language in RUNNABLE]


def _recipes() -> list[Block]:
    return [
        block
        for page in pages()
        for block in blocks(page)
        if block.language == "yaml" and block.code.startswith("recipes:")
    ]


def _command(block: Block, script: Path) -> list[str]:
    if RUNNABLE[block.language] == "python":
        return [str(script.parent / ".venv" / "bin" / "python"), str(script)]
    return ["bash", "-e", "-o", "pipefail", str(script)]


@pytest.mark.parametrize("block", _runnable(), ids=lambda block: block.name)
def test_block_runs(block: Block, request: pytest.FixtureRequest) -> None:
    if block.skip_reason is not None:
        pytest.skip(block.skip_reason)
    stack: DocsStack = request.getfixturevalue("docs_stack")
    suffix = "py" if block.language == "python" else "sh"
    script = stack.folder / f"{block.page.stem}-{block.line}.{suffix}"
    script.write_text(stack.localize(block.code))
    result = subprocess.run(
        _command(block, script),
        cwd=stack.folder,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"{block.name} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
        f"\n--- stderr\n{result.stderr[-4000:]}"
    )


@pytest.mark.parametrize("block", _recipes(), ids=lambda block: block.name)
def test_recipe_example_loads(block: Block) -> None:
    for recipe in yaml.safe_load(block.code)["recipes"]:
        Recipe.model_validate(recipe)
