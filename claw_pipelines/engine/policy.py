"""The simulated policy: what the engine "decides" to say, drawn from a seeded RNG.

It behaves like a small, imperfect model on the arithmetic tasks of ``tasks``: with a calculator
tool it sometimes calls the tool and then answers from the result (now and then double-checking
with a second call first), sometimes answers directly (right or wrong), and sometimes rambles
until it hits the token limit. That spread is what makes rewards vary inside a GRPO group of
identical prompts. Every choice comes from the ``random.Random`` passed in, so a run is
reproducible from the engine seed.

Real agents (Claude Code, Codex CLI, OpenClaw) declare shells, file tools and sub-agents instead,
and run every call they get, so the policy calls those only with arguments that read
(``agent_tools``): a shell computes the task (``echo $((17 + 25))``) where there is no
calculator, and a request that is not arithmetic is answered after exploring the working
directory with them (``exploring``). Tools it does not recognise (patches, edits, the web) are
never called.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from claw_pipelines.engine import exploring
from claw_pipelines.engine.agent_tools import Kind, Toolbox, tool_output
from claw_pipelines.engine.chat_template import dumps
from claw_pipelines.engine.protocol import FunctionCall, Message, Tool
from claw_pipelines.engine.tasks import Task, final_answer_text, first_number, parse_question
from claw_pipelines.engine.tokenizer import encode

P_TOOL = 0.35
P_RAMBLE = 0.12
P_CORRECT = 0.45
P_RECHECK = 0.25
CALCULATOR = "calculator"
RAMBLE_LIMIT = 1024
"""A ramble ends by itself after about this many tokens when ``max_tokens`` leaves more room."""

NO_TASK_REPLY = "I can only do arithmetic: ask me to add, subtract or multiply two whole numbers."
"""The reply to a prompt with no task. It holds no numbers, so it is never itself read as a task
(a conversation that quotes it gets it again, not an answer)."""
_DIRECT = (
    "Let me compute {expr} step by step. {expr} = {value}. ",
    "{expr} equals {value}. ",
    "I think about the tens and the ones first, then carry. ",
    "Hmm, {expr}... let me check the digits again. ",
)
_FROM_TOOL = (
    "The calculator returned {value}. ",
    "The tool says {expr} = {value}. ",
    "Using the calculator result, {expr} = {value}. ",
)
_RAMBLE = (
    " Hmm, let me think about this carefully.",
    " First I consider the tens digit of {a}.",
    " Then the ones digit, and maybe a carry.",
    " Wait, let me check that again.",
    " Actually, maybe I should use a different approach.",
    " So the sum of the digits is not quite right yet.",
    " Perhaps {b} is the number I should look at first.",
    " Okay, let me start over and be more careful...",
)


@dataclass(frozen=True)
class Draft:
    """What the policy wants to say before tokenization and the token limit."""

    text: str
    tool_call: FunctionCall | None = None


def _latest_task(messages: Sequence[Message]) -> tuple[Task, int] | None:
    """The last question asked and how many tool calls the assistant made since."""
    calls = 0
    for message in reversed(messages):
        if message.role == "user" and (task := parse_question(message.text())) is not None:
            return task, calls
        if message.role == "assistant":
            calls += len(message.tool_calls or [])
    return None


def _recheck_expression(task: Task) -> str:
    """The same sum or product with its operands swapped, as a cautious model would verify."""
    return f"{task.b} {task.op} {task.a}" if task.op in "+*" else task.expression


def _takes_expression(tool: Tool) -> bool:
    properties = (tool.function.parameters or {}).get("properties")
    return isinstance(properties, dict) and "expression" in properties


def _has_calculator(tools: Sequence[Tool], tool_choice: str | None) -> bool:
    """Whether the declared calculator may be called: ``tool_choice`` ("none", "auto",
    "required" or the name of the one tool allowed) may rule it out."""
    if tool_choice not in (None, "auto", "required", CALCULATOR):
        return False
    return any(t.function.name == CALCULATOR and _takes_expression(t) for t in tools)


def _compute(expression: str, calculator: bool, toolbox: Toolbox) -> FunctionCall | None:
    """The call that computes ``expression``: the calculator, else shell arithmetic."""
    if calculator:
        return FunctionCall(name=CALCULATOR, arguments=dumps({"expression": expression}))
    shell = toolbox.get(Kind.SHELL)
    line = f"echo $(({expression}))"
    return shell.call(line, f"Compute {expression}") if shell else None


def _answer(task: Task, rng: random.Random) -> Draft:
    correct = rng.random() < P_CORRECT
    value = task.answer if correct else task.answer + rng.choice((-10, -2, -1, 1, 2, 10))
    lead = rng.choice(_DIRECT).format(expr=task.expression, value=value)
    return Draft(lead + final_answer_text(value))


def _answer_from_tool(task: Task, result: str, rng: random.Random) -> Draft:
    value = first_number(tool_output(result))
    if value is None:
        return _answer(task, rng)
    lead = rng.choice(_FROM_TOOL).format(expr=task.expression, value=value)
    return Draft(lead + final_answer_text(value))


def ramble(task: Task, budget: int, rng: random.Random) -> Draft:
    """Thinking out loud that never reaches an answer.

    It runs past ``budget`` (so it ends at the token limit) when that is at most ``RAMBLE_LIMIT``
    tokens, and otherwise stops by itself after about ``RAMBLE_LIMIT``: a real model would go on
    to a 32k ``max_tokens``, but simulating that only slows every stream down. Sentences start with
    a space, where the tokenizer always splits, so their token counts add up.
    """
    sentences: list[str] = []
    tokens = 0
    while tokens <= min(budget, RAMBLE_LIMIT):
        sentence = rng.choice(_RAMBLE).format(a=task.a, b=task.b)
        sentences.append(sentence)
        tokens += len(encode(sentence))
    return Draft("".join(sentences))


def respond_chat(
    messages: Sequence[Message],
    tools: Sequence[Tool],
    tool_choice: str | None,
    budget: int,
    rng: random.Random,
) -> Draft:
    """The next assistant turn. ``tool_choice`` is "none"/"auto"/"required" or a tool's name.

    ``budget`` is the token limit. "required" (or a named tool) makes it compute the task with
    the calculator or a shell. Without a tool it may call harmlessly it answers in plain text
    instead: vLLM would force *some* call by guided decoding, but its arguments would be made
    up, and an agent runs the calls it gets (a shell command, a patch); a text answer just ends
    the agent's turn, which every agent handles.
    """
    toolbox = Toolbox.of(tools, tool_choice)
    # With tools to explore, only a question of the current user turn counts: a new request
    # after an answer is not the earlier task again.
    asked = exploring.current_turn(messages) if toolbox.can_explore else messages
    latest = _latest_task(asked)
    if latest is None:
        return _explore(messages, toolbox, rng)
    task, calls = latest
    calculator = _has_calculator(tools, tool_choice)
    forced = tool_choice not in (None, "none", "auto")
    if messages[-1].role == "tool":
        recheck = _compute(_recheck_expression(task), calculator, toolbox)
        if recheck and calls == 1 and rng.random() < P_RECHECK:
            return Draft("", tool_call=recheck)
        return _answer_from_tool(task, messages[-1].text(), rng)
    call = _compute(task.expression, calculator, toolbox)
    if call and (forced or rng.random() < P_TOOL):
        return Draft("", tool_call=call)
    if rng.random() < P_RAMBLE:
        return ramble(task, budget, rng)
    return _answer(task, rng)


def _explore(messages: Sequence[Message], toolbox: Toolbox, rng: random.Random) -> Draft:
    """A request that is not arithmetic: explore with the agent's tools, then report."""
    if not toolbox.can_explore:
        return Draft(NO_TASK_REPLY)
    call, done = exploring.next_call(messages, toolbox, rng)
    return Draft("", tool_call=call) if call else Draft(exploring.report(done))


def respond_text(prompt: str, budget: int, rng: random.Random) -> Draft:
    """A plain-completion continuation: answer the last question in the prompt, if any."""
    task = parse_question(prompt)
    if task is None:
        return Draft(" " + NO_TASK_REPLY)
    if rng.random() < P_RAMBLE:
        return ramble(task, budget, rng)
    return Draft(" " + _answer(task, rng).text)
