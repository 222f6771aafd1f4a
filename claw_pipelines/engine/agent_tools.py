"""The tools of real agents the simulated policy may call, and how it reads what they return.

Agents declare their own tools: Codex CLI's ``exec_command`` shell, Claude Code's ``Bash``,
``Read`` and ``Agent``, OpenClaw's ``exec`` and ``read``, MCP tools (``mcp__<server>__<tool>``)…
The agent runs whatever call it gets, so the policy only calls a tool it recognises by name and
parameters as one of four kinds, and only with arguments that read and never write: ``pwd``,
``ls -p``, ``cat`` of a plain file name it listed, a file read, a directory listing, a sub-agent
asked to do the same. Each call's arguments name the move they make (``ToolMove``), so the policy
reads its progress back from the conversation alone and its choices stay reproducible.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from claw_pipelines.engine.chat_template import dumps
from claw_pipelines.engine.protocol import FunctionCall, Tool


class Kind(StrEnum):
    SHELL = "shell"
    READ = "read"
    LIST = "list"
    SUBAGENT = "subagent"


SHELL_NAMES = {"bash", "shell", "shell_command", "exec_command", "exec", "run_shell_command"}
READ_NAMES = {"read", "read_file", "read_text_file", "view_file", "cat"}
LIST_NAMES = {"ls", "list", "list_dir", "list_directory", "list_files", "glob"}
SUBAGENT_NAMES = {"agent", "task"}
PARAMETERS = {
    Kind.SHELL: ("command", "cmd"),
    Kind.READ: ("file_path", "path", "filePath", "filename"),
    Kind.LIST: ("path", "directory", "dir", "pattern"),
    Kind.SUBAGENT: ("prompt",),
}
"""The property each kind's one argument goes in, in order of preference."""
SUBAGENT_TYPE = "general-purpose"
PLAIN_NAME = re.compile(r"[\w][\w.-]*")
"""A file name the policy reads: listed by itself, no spaces, quotes or shell syntax."""
OUTPUT_MARKER = re.compile(r"^Output:\n", re.MULTILINE)
LINE_NUMBER = re.compile(r"^ *\d+(?:\t|\u2192)", re.MULTILINE)


@dataclass(frozen=True)
class AgentTool:
    """A declared tool the policy knows how to call harmlessly."""

    name: str
    kind: Kind
    parameter: str
    argv: bool = False
    """A shell whose command is an argument vector (``["bash", "-lc", line]``)."""
    properties: frozenset[str] = frozenset()
    """All it takes: a ``description`` (Claude Code's ``Bash`` and ``Agent``) says why."""

    def call(self, value: str, description: str) -> FunctionCall:
        """The call passing ``value`` (a command line, a path, a pattern, a prompt)."""
        argument: object = ["bash", "-lc", value] if self.argv else value
        arguments: dict[str, object] = {self.parameter: argument}
        if "description" in self.properties:
            arguments["description"] = description
        if self.kind is Kind.SUBAGENT and "subagent_type" in self.properties:
            arguments["subagent_type"] = SUBAGENT_TYPE
        return FunctionCall(name=self.name, arguments=dumps(arguments))

    def value(self, call: FunctionCall) -> str | None:
        """The value a call of this tool passed, or None when it passed none the policy reads."""
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            return None
        value = arguments.get(self.parameter) if isinstance(arguments, dict) else None
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value[-1]
        return value if isinstance(value, str) else None


def _base_name(name: str) -> str:
    """An MCP tool's own name (``mcp__files__read_file`` → ``read_file``), lower-cased."""
    return name.rsplit("__", 1)[-1].lower()


def _kind(name: str) -> Kind | None:
    base = _base_name(name)
    for kind, names in (
        (Kind.SHELL, SHELL_NAMES),
        (Kind.READ, READ_NAMES),
        (Kind.LIST, LIST_NAMES),
        (Kind.SUBAGENT, SUBAGENT_NAMES),
    ):
        if base in names:
            return kind
    return None


def recognise(tool: Tool) -> AgentTool | None:
    """The tool as one the policy may call, or None: unknown, or its other required parameters
    would need values the policy cannot choose harmlessly."""
    kind = _kind(tool.function.name)
    schema = tool.function.parameters or {}
    properties = schema.get("properties")
    if kind is None or not isinstance(properties, dict):
        return None
    parameter = next((p for p in PARAMETERS[kind] if p in properties), None)
    if parameter is None:
        return None
    required = tuple(schema.get("required") or ())
    fillable = {parameter, "description"} | ({"subagent_type"} if kind is Kind.SUBAGENT else set())
    if not set(required) <= fillable:
        return None
    argv = (properties[parameter] or {}).get("type") == "array"
    return AgentTool(tool.function.name, kind, parameter, argv, frozenset(properties))


@dataclass(frozen=True)
class Toolbox:
    """The agent tools of one request: every one recognised, by name (to read back the calls
    made so far), and those the policy may call now, one of each kind (the first declared)."""

    known: dict[str, AgentTool]
    usable: dict[Kind, AgentTool]

    @classmethod
    def of(cls, tools: Sequence[Tool], tool_choice: str | None) -> Toolbox:
        """``tool_choice`` "none" leaves none usable; a tool's name leaves only that one."""
        known = {tool.name: tool for tool in map(recognise, tools) if tool is not None}
        usable: dict[Kind, AgentTool] = {}
        for tool in known.values():
            allowed = tool_choice in (None, "auto", "required") or tool_choice == tool.name
            if allowed and tool.kind not in usable:
                usable[tool.kind] = tool
        return cls(known, usable)

    def get(self, kind: Kind) -> AgentTool | None:
        return self.usable.get(kind)

    @property
    def can_explore(self) -> bool:
        """Whether it can list a directory and read what it lists."""
        return Kind.SHELL in self.usable or {Kind.LIST, Kind.READ} <= self.usable.keys()


def tool_output(result: str) -> str:
    """What a command or read printed, without the agent's wrapping: Codex's ``exec_command``
    header (``…\\nOutput:\\n``), a JSON ``{"output": …}``, Claude Code's line numbers."""
    text = result
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("output"), str):
        text = parsed["output"]
    markers = list(OUTPUT_MARKER.finditer(text))
    if markers:
        text = text[markers[-1].end() :]
    return LINE_NUMBER.sub("", text)


def listed_files(output: str) -> list[str]:
    """The plain file names in a listing (``ls -p``, a list tool, or a glob's absolute paths);
    directories (a trailing ``/``) and anything else are left out."""
    lines = (line.strip() for line in output.splitlines())
    names = (posixpath.basename(line) for line in lines if not line.endswith("/"))
    return [name for name in names if PLAIN_NAME.fullmatch(name)]
