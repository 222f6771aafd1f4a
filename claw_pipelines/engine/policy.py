"""The simulated policy: what the engine "decides" to say, drawn from a seeded RNG.

It behaves like a small, imperfect model on the arithmetic tasks of ``tasks``: with a calculator
tool it sometimes calls the tool and then answers from the result (now and then double-checking
with a second call first), sometimes answers directly (right or wrong), and sometimes rambles
until it hits the token limit. That spread is what makes
rewards vary inside a GRPO group of identical prompts. Every choice comes from the ``random.Random``
passed in, so a run is reproducible from the engine seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from claw_pipelines.engine.chat_template import dumps
from claw_pipelines.engine.protocol import FunctionCall, Message, Tool
from claw_pipelines.engine.tasks import Task, final_answer_text, first_number, parse_question
from claw_pipelines.engine.tokenizer import encode

P_TOOL = 0.35
P_RAMBLE = 0.12
P_CORRECT = 0.45
P_RECHECK = 0.25
CALCULATOR = "calculator"

NO_TASK_REPLY = "Please ask me an arithmetic question, for example what is 2 plus 3."
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


def _tool_name(tools: Sequence[Tool], forced: str | None) -> str:
    names = [tool.function.name for tool in tools]
    return forced or (CALCULATOR if CALCULATOR in names else names[0])


def _answer(task: Task, rng: random.Random) -> Draft:
    correct = rng.random() < P_CORRECT
    value = task.answer if correct else task.answer + rng.choice((-10, -2, -1, 1, 2, 10))
    lead = rng.choice(_DIRECT).format(expr=task.expression, value=value)
    return Draft(lead + final_answer_text(value))


def _answer_from_tool(task: Task, result: str, rng: random.Random) -> Draft:
    value = first_number(result)
    if value is None:
        return _answer(task, rng)
    lead = rng.choice(_FROM_TOOL).format(expr=task.expression, value=value)
    return Draft(lead + final_answer_text(value))


def ramble(task: Task, min_tokens: int, rng: random.Random) -> Draft:
    """Thinking out loud that never reaches an answer; longer than ``min_tokens`` tokens.

    Sentences start with a space, where the tokenizer always splits, so their token counts add up.
    """
    sentences: list[str] = []
    tokens = 0
    while tokens <= min_tokens:
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

    ``budget`` is the token limit; a ramble is made longer than it.
    """
    latest = _latest_task(messages)
    if latest is None:
        return Draft(NO_TASK_REPLY)
    task, calls = latest
    named = tool_choice not in (None, "none", "auto", "required")
    forced = named or tool_choice == "required"
    may_call = bool(tools) and tool_choice != "none"
    name = _tool_name(tools, tool_choice if named else None) if may_call else ""
    if messages[-1].role == "tool":
        if may_call and calls == 1 and rng.random() < P_RECHECK:
            arguments = dumps({"expression": _recheck_expression(task)})
            return Draft("", tool_call=FunctionCall(name=name, arguments=arguments))
        return _answer_from_tool(task, messages[-1].text(), rng)
    if may_call and (forced or rng.random() < P_TOOL):
        arguments = dumps({"expression": task.expression})
        return Draft("", tool_call=FunctionCall(name=name, arguments=arguments))
    if rng.random() < P_RAMBLE:
        return ramble(task, budget, rng)
    return _answer(task, rng)


def respond_text(prompt: str, budget: int, rng: random.Random) -> Draft:
    """A plain-completion continuation: answer the last question in the prompt, if any."""
    task = parse_question(prompt)
    if task is None:
        return Draft(" " + NO_TASK_REPLY)
    if rng.random() < P_RAMBLE:
        return ramble(task, budget, rng)
    return Draft(" " + _answer(task, rng).text)
