"""The arithmetic task format shared by the simulated policy and the demo agent.

The demo asks questions in this format and scores answers with it; the engine's policy parses the
same format. Keeping both directions here means the two can never drift apart.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass

OPERATORS = ("+", "-", "*")
QUESTION_RE = re.compile(r"What is (-?\d+) ([+*-]) (-?\d+)\?")
ANSWER_RE = re.compile(r"[Tt]he answer is (-?\d+)")
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Task:
    """One verifiable question: ``a op b``."""

    a: int
    op: str
    b: int

    @property
    def expression(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def question(self) -> str:
        return f"What is {self.expression}?"

    @property
    def answer(self) -> int:
        return int(evaluate(self.expression))

    @property
    def task_id(self) -> str:
        """Content-derived, so the same question gets the same id in every run."""
        return f"arith:{self.a}{self.op}{self.b}"


def generate_tasks(count: int, seed: int) -> list[Task]:
    """``count`` tasks drawn from ``seed`` (same seed, same tasks)."""
    rng = random.Random(f"tasks:{seed}")
    return [
        Task(rng.randint(2, 99), rng.choice(OPERATORS), rng.randint(2, 99)) for _ in range(count)
    ]


def parse_question(text: str) -> Task | None:
    """The last task asked in ``text``, if any."""
    matches = QUESTION_RE.findall(text)
    if not matches:
        return None
    a, op, b = matches[-1]
    return Task(int(a), op, int(b))


def final_answer_text(value: int) -> str:
    return f"The answer is {value}."


def parse_final_answer(text: str | None) -> int | None:
    """The number in the last "The answer is N" of ``text``; None when there is none."""
    matches = ANSWER_RE.findall(text or "")
    return int(matches[-1]) if matches else None


def first_number(text: str) -> int | float | None:
    """The first number in a tool result, as the policy reads it."""
    match = NUMBER_RE.search(text)
    if match is None:
        return None
    value = float(match.group())
    return int(value) if value.is_integer() else value


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPRESSION_CHARS = 200


def evaluate(expression: str) -> int | float:
    """Evaluate ``+ - * /`` arithmetic on numbers and parentheses, without ``eval``.

    The calculator tool runs agent-chosen text, so only this small grammar is accepted; anything
    else raises ``ValueError``. Integral results come back as ``int``.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _eval_node(tree.body)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    raise ValueError(f"unsupported element: {type(node).__name__}")
