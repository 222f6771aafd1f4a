"""Long strings are scrubbed once and remembered (``redaction.ScrubMemo``): an agent's history
comes back on every call."""

from __future__ import annotations

from claw_pipelines.redaction import MEMO_MIN_CHARS, REDACTED, Redactor, ScrubMemo

KEY = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0" * 2
HISTORY = "x" * MEMO_MIN_CHARS + f" the key is {KEY} and more text"


def test_a_long_string_is_scrubbed_the_same_from_memory() -> None:
    redactor = Redactor()
    first = redactor.text(HISTORY)
    again = redactor.text("".join(list(HISTORY)))  # equal text, another object
    assert KEY not in first and REDACTED in first
    assert again is first


def test_a_secret_added_later_is_scrubbed_from_remembered_text() -> None:
    secret = "backend-key-0042"
    text = "y" * MEMO_MIN_CHARS + f" echoed {secret}"
    redactor = Redactor()
    assert secret in redactor.text(text)
    redactor.add_secret(secret)
    assert secret not in redactor.text(text)


def test_the_memory_keeps_within_its_size_least_recently_used_forgotten() -> None:
    scrubbed: list[str] = []

    def scrub(value: str) -> str:
        scrubbed.append(value)
        return value  # nothing to scrub: the text is kept once

    memo = ScrubMemo(max_chars=2 * MEMO_MIN_CHARS)
    a, b, c = ("a" * MEMO_MIN_CHARS, "b" * MEMO_MIN_CHARS, "c" * MEMO_MIN_CHARS)
    for value in (a, b, a, c, a, b):
        assert memo.scrubbed(value, scrub) == value
    assert scrubbed == [a, b, c, b]  # c pushed b out (a was used since), then b pushed c out
    too_big = "d" * (3 * MEMO_MIN_CHARS)
    memo.scrubbed(too_big, scrub)
    memo.scrubbed(too_big, scrub)
    memo.scrubbed(a, scrub)
    memo.scrubbed(b, scrub)
    assert scrubbed == [a, b, c, b, too_big, too_big]  # never kept, and it pushed nothing out
