"""The arithmetic task format shared by the simulated policy and the demo agent.

The demo asks questions in this format ("What is 17 + 25?") and scores answers with it; the
engine's policy reads that format and the other usual ways of asking the same ("17 plus 25",
"compute 6*7", "17+25=?"). Keeping both directions here means the two can never drift apart.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass

OPERATORS = ("+", "-", "*")
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


# The phrasings understood, as a model would read them. A phrasing with a lead-in ("what is",
# "compute", ...) or a word form ("the sum of 17 and 25") may sit anywhere in the text; a bare
# expression ("17 + 25", "17+25=?", "17 minus 4") only counts when it is a whole line, so dates,
# version numbers and ranges in an agent's long prompt are not read as questions.
_FIRST = r"(?<![\w.])-?\d+(?![\d.]*\d)"  # not the tail of a name ("v2") or of a decimal
_SECOND = r"-?\d+(?![\d.]*\d)"
_SYMBOLS = {"+": "+", "-": "-", "\u2212": "-", "*": "*", "x": "*", "\u00d7": "*"}
_WORDS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*"}
_OP = r"[+*\u00d7\u2212-]|x|plus|minus|times|multiplied\s+by"
_EXPR = rf"(?P<a>{_FIRST})\s*(?P<op>{_OP})\s*(?P<b>{_SECOND})"
# Not the first two operands of a longer expression ("2 + 3 * 4") or of a date ("2025-01-15").
_END = r"(?!\s*(?:[+*/\u00d7\u2212-]|\b(?:x|plus|minus|times|multiplied|divided)\b)\s*\d)"
_LEAD = (
    r"what\s+is|what['\u2019]?s|how\s+much\s+is|compute|calculate|evaluate|solve"
    r"|work\s+out|tell\s+me"
)
_RESULT_OF = r"(?:the\s+(?:value|result|answer)\s+(?:of|to)\s+)?"
_LED = re.compile(rf"\b(?:{_LEAD})\s*:?\s*{_RESULT_OF}{_EXPR}{_END}", re.IGNORECASE)
_GAP = r"[^\S\n]*"  # spaces within one line
_BARE = re.compile(rf"^{_GAP}{_EXPR}{_GAP}(?:={_GAP}\??|\?)?{_GAP}[.!]?{_GAP}$", re.I | re.M)
_PAIR = rf"(?P<a>{_FIRST})\s+(?:and|to|by)\s+(?P<b>{_SECOND})"
_FORMS = (
    (re.compile(rf"\b(?:the\s+)?sum\s+of\s+{_PAIR}", re.I), "+"),
    (re.compile(rf"\badd\s+{_PAIR}", re.I), "+"),
    (re.compile(rf"\bsubtract\s+(?P<b>{_FIRST})\s+from\s+(?P<a>{_SECOND})", re.I), "-"),
    (re.compile(rf"\b(?:the\s+)?product\s+of\s+{_PAIR}", re.I), "*"),
    (re.compile(rf"\bmultiply\s+{_PAIR}", re.I), "*"),
)


def _operator(word: str) -> str:
    word = " ".join(word.lower().split())
    return _SYMBOLS.get(word) or _WORDS[word]


def _matches(text: str) -> list[tuple[int, Task]]:
    """Every task phrased in ``text``, with where its phrasing ends."""
    found = [
        (m.end(), Task(int(m["a"]), _operator(m["op"]), int(m["b"])))
        for pattern in (_LED, _BARE)
        for m in pattern.finditer(text)
    ]
    found += [
        (m.end(), Task(int(m["a"]), op, int(m["b"])))
        for pattern, op in _FORMS
        for m in pattern.finditer(text)
    ]
    return found


def parse_question(text: str) -> Task | None:
    """The last task asked in ``text``, in any of the phrasings above; None when there is none."""
    found = _matches(text)
    return max(found, key=lambda hit: hit[0])[1] if found else None


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
