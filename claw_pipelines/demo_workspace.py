"""``claw demo --long``: long agent sessions over a small in-memory workspace.

Real CLI agents start from a long system prompt (27k tokens for Codex) and make dozens of tool
calls per task, and that is the shape sequence batches are made for. Here each group's task is
"how many lines do the workspace's files hold together?", asked with a long handbook as the
system prompt; the agent offers ``list_files`` and ``read_file`` over the workspace, and the
embedded engine lists it and reads the files one call at a time (its tool loop stops early now
and then, which is what makes rewards differ within a group). Everything is drawn from a seed,
so a workspace and its answer are reproducible.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from typing import Any

from claw_pipelines.engine.tokenizer import encode

LONG_SYSTEM_TOKENS = 27_000
WORKSPACE_FILES = 30
QUESTION = (
    "Read every file in the workspace, one at a time, and tell me how many lines they hold "
    "together. End with 'The answer is N.'"
)
_TOPICS = ("build", "review", "testing", "releases", "logging", "storage", "security", "docs")
_RULES = (
    "Read a file before you change it, and say which file you read.",
    "Prefer small steps that can be checked over large ones that cannot.",
    "Never guess a file's content: list the workspace and read what is there.",
    "Keep answers short and say how you know what you say.",
    "Report what the tools returned, not what you expected them to return.",
    "When a tool fails, say so and try another way instead of repeating the call.",
)
_WORDS = ("alpha", "beta", "gamma", "delta", "sigma", "omega", "kappa", "lambda", "theta")
_KINDS = (("notes", "md"), ("module", "py"), ("config", "toml"), ("log", "txt"))


def _tool(name: str, description: str, path: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": path}},
        "required": ["path"],
    }
    function = {"name": name, "description": description, "parameters": schema}
    return {"type": "function", "function": function}


TOOLS: list[dict[str, Any]] = [
    _tool("list_files", "List the files of the workspace, one name a line.", path="A folder: '.'"),
    _tool("read_file", "Read one file of the workspace.", path="The file's name"),
]


def handbook(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (at least one section): an agent handbook of
    numbered rules, as real agents' long system prompts are. Its sections end at a newline, where
    the tokenizer always splits, so their token counts add up."""
    sections = ["You are a careful coding agent working in a small workspace.\n\n"]
    total = len(encode(sections[0]))
    for index in itertools.count(1):
        topic = _TOPICS[index % len(_TOPICS)]
        rules = "\n".join(f"- {_RULES[(index + k) % len(_RULES)]}" for k in range(4))
        section = f"## Section {index}: {topic}\n{rules}\n"
        sections.append(section)
        total += len(encode(section))
        if total >= tokens:
            break
    return "".join(sections)


@dataclass(frozen=True)
class Workspace:
    """One group's task: a few files, and the question about them."""

    seed: int
    files: dict[str, str]

    @property
    def question(self) -> str:
        return QUESTION

    @property
    def answer(self) -> int:
        return sum(len(text.splitlines()) for text in self.files.values())

    @property
    def task_id(self) -> str:
        return f"workspace:{self.seed}:{len(self.files)}"

    def run_tool(self, name: str, arguments: str) -> str:
        """One tool call from its JSON arguments; failures become the tool's answer."""
        try:
            path = str(json.loads(arguments).get("path", "."))
        except (ValueError, AttributeError) as exc:
            return f"error: {exc}"
        if name == "list_files":
            return "\n".join(self.files)
        if name == "read_file":
            text = self.files.get(path.removeprefix("./"))
            return text if text is not None else f"error: no file named {path!r}"
        return f"error: no tool named {name!r}"


def generate_workspaces(count: int, seed: int, files: int = WORKSPACE_FILES) -> list[Workspace]:
    """``count`` workspaces of ``files`` files each, drawn from ``seed``."""
    rng = random.Random(f"workspaces:{seed}")
    return [_workspace(rng.getrandbits(31), files) for _ in range(count)]


def _workspace(seed: int, count: int) -> Workspace:
    rng = random.Random(seed)
    files = {}
    for index in range(count):
        stem, suffix = _KINDS[index % len(_KINDS)]
        lines = [
            f"{rng.choice(_WORDS)} {rng.choice(_WORDS)} {rng.choice(_TOPICS)}"
            for _ in range(rng.randint(2, 24))
        ]
        files[f"{stem}_{index:02d}.{suffix}"] = "\n".join(lines) + "\n"
    return Workspace(seed, files)
