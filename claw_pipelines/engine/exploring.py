"""The simulated policy's tool loop with an agent's own tools: look around, read, then answer.

Asked anything but arithmetic by an agent with a shell (or a list and a read tool), the policy
behaves like a model that looks before it answers: where it is (``pwd``), what is there
(``ls -p``), then each listed file in turn (the agent's read tool, else ``cat``), and answers from
what the tools returned: how many files it read and how many lines they hold ("The answer is N",
so a rule can score it). Asked to use a sub-agent, it hands that work to the agent's sub-agent
tool instead and answers with its report. Before each further read it may stop early
(``P_STOP_EARLY``), which is what makes rewards differ inside a group; it never makes more than
``MAX_TOOL_CALLS`` calls in one user turn. Its progress is read back from the conversation, so
the same conversation always gets the same next move from the same RNG.
"""

from __future__ import annotations

import posixpath
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from claw_pipelines.engine.agent_tools import (
    PLAIN_NAME,
    AgentTool,
    Kind,
    Toolbox,
    listed_files,
    tool_output,
)
from claw_pipelines.engine.protocol import FunctionCall, Message
from claw_pipelines.engine.tasks import final_answer_text

P_STOP_EARLY = 0.03
MAX_TOOL_CALLS = 64
FILES_NAMED = 6
"""How many of the files read the answer names before "and N more"."""
PWD, LIST = "pwd", "ls -p"
DELEGATE_RE = re.compile(r"\bsub-?agents?\b", re.IGNORECASE)
CAT_RE = re.compile(rf"cat ({PLAIN_NAME.pattern})")
"""The read it makes with a shell: ``cat`` of a plain name, which needs no quoting."""
DELEGATED_PROMPT = "List the files in the working directory and read each of them."


@dataclass
class Progress:
    """What the tool calls of the current user turn found out so far."""

    calls: int = 0
    asked_cwd: bool = False
    cwd: str | None = None
    listing: list[str] | None = None
    read: dict[str, str] = field(default_factory=dict)
    report: str | None = None
    """A sub-agent's answer."""

    def record(self, tool: AgentTool, value: str, output: str) -> None:
        """Note what one earlier call (``value`` passed to ``tool``) returned."""
        self.calls += 1
        if tool.kind is Kind.SUBAGENT:
            self.report = output.strip()
        elif tool.kind is Kind.LIST or (tool.kind is Kind.SHELL and value == LIST):
            self.listing = listed_files(output)
        elif tool.kind is Kind.READ:
            self.read[posixpath.basename(value)] = output
        elif value == PWD:
            self.asked_cwd = True
            first = output.strip().splitlines()[:1]
            self.cwd = first[0] if first and first[0].startswith("/") else None
        elif (cat := CAT_RE.fullmatch(value)) is not None:
            self.read[cat[1]] = output


def current_turn(messages: Sequence[Message]) -> Sequence[Message]:
    """The messages since the assistant last answered without a tool call."""
    answered = [i for i, m in enumerate(messages) if m.role == "assistant" and not m.tool_calls]
    return messages[answered[-1] + 1 :] if answered else messages


def progress(messages: Sequence[Message], toolbox: Toolbox) -> Progress:
    """The current turn's calls of known tools, with their results (by call id)."""
    turn = current_turn(messages)
    results = {m.tool_call_id: m.text() for m in turn if m.role == "tool"}
    found = Progress()
    calls = (call for m in turn if m.role == "assistant" for call in m.tool_calls or [])
    for call in calls:
        tool = toolbox.known.get(call.function.name)
        value = tool.value(call.function) if tool else None
        if tool is not None and value is not None:
            found.record(tool, value, tool_output(results.get(call.id, "")))
    return found


def _asks_to_delegate(turn: Sequence[Message]) -> bool:
    return any(m.role == "user" and DELEGATE_RE.search(m.text()) for m in turn)


def next_call(
    messages: Sequence[Message], toolbox: Toolbox, rng: random.Random
) -> tuple[FunctionCall | None, Progress]:
    """The next exploring call, or None when it is time to answer; and the progress so far."""
    done = progress(messages, toolbox)
    shell, reader = toolbox.get(Kind.SHELL), toolbox.get(Kind.READ)
    lister, helper = toolbox.get(Kind.LIST), toolbox.get(Kind.SUBAGENT)
    if done.calls >= MAX_TOOL_CALLS or done.report is not None:
        return None, done
    if helper and done.calls == 0 and _asks_to_delegate(current_turn(messages)):
        return helper.call(DELEGATED_PROMPT, "Explore the working directory"), done
    if shell and not done.asked_cwd:
        return shell.call(PWD, "Print the working directory"), done
    if done.listing is None:
        if shell:
            return shell.call(LIST, "List the files in the working directory"), done
        if lister:
            where = "*" if lister.parameter == "pattern" else done.cwd or "."
            return lister.call(where, "List the files in the working directory"), done
        return None, done
    unread = [name for name in done.listing if name not in done.read]
    if not unread or (done.read and rng.random() < P_STOP_EARLY):
        return None, done
    name = unread[0]
    if reader:
        return reader.call(posixpath.join(done.cwd or "", name), f"Read {name}"), done
    if shell:
        return shell.call(f"cat {name}", f"Read {name}"), done
    return None, done


def report(done: Progress) -> str:
    """The answer from what the tools returned."""
    if done.report is not None:
        return f"A sub-agent explored the working directory. Its report: {done.report}"
    where = f" in {done.cwd}" if done.cwd else ""
    if not done.read:
        return f"I found no files to read{where}."
    names = list(done.read)
    shown = ", ".join(names[:FILES_NAMED])
    more = f" and {len(names) - FILES_NAMED} more" if len(names) > FILES_NAMED else ""
    lines = sum(len(output.splitlines()) for output in done.read.values())
    listed = len(done.listing or names)
    return (
        f"I read {len(names)} of the {listed} files{where}: {shown}{more}. "
        f"Together they hold {lines} lines. {final_answer_text(lines)}"
    )
