"""Each credential shape the scrubber knows, in any case, in values and in keys; and the ordinary
text that only resembles one, which is kept."""

from __future__ import annotations

import json
import random
import time

import polars as pl
import pytest

from assets.metadata import markdown_table
from claw_pipelines.redaction import (
    CREDENTIAL_SHAPES,
    REDACTED,
    Redactor,
    looks_like_secret,
    names_a_secret,
)

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fw"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        (f"Authorization: bearer {JWT}", "Authorization: [REDACTED]"),
        ("authorization: BEARER abcdef123456", "authorization: [REDACTED]"),
        ("auth_Bearer abcdef123456", "auth_[REDACTED]"),
        ("bearer " + "a" * 30, REDACTED),
        (f"token={JWT};", "token=[REDACTED];"),
        ("id ASIAIOSFODNN7EXAMPLE used", "id [REDACTED] used"),
        ("keyAKIAIOSFODNN7EXAMPLE!", "key[REDACTED]!"),
        ("role AROAIOSFODNN7EXAMPLE", "role [REDACTED]"),
        ("git ghp_" + "a1B2" * 9, "git [REDACTED]"),
        ("x_gho_" + "Z9" * 18 + " y", "x_[REDACTED] y"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstu", REDACTED),
        (f"aws_secret_access_key = {AWS_SECRET}", "aws_secret_access_key = [REDACTED]"),
        (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n", "AWS_SECRET_ACCESS_KEY=[REDACTED]\n"),
        (f'{{"SecretAccessKey": "{AWS_SECRET}"}}', '{"SecretAccessKey": "[REDACTED]"}'),
        ("use sk-proj-abcdef123456 now", "use [REDACTED] now"),
        ("é BEARER abcdef123456 İ", "é [REDACTED] İ"),  # lower-casing changes the length
    ],
)
def test_each_shape_is_scrubbed_in_any_case_and_glued(text: str, scrubbed: str) -> None:
    assert Redactor().text(text) == scrubbed
    assert looks_like_secret(text)


@pytest.mark.parametrize(
    "text",
    [
        "3fa85f64-5717-4562-b3fc-2c963f66afa6",
        "bearer tokens go in the Authorization header",
        "The Bearer instruments were sold",
        "ASIAN markets and AKIAN chairs",
        "a secret access key is never logged",
        "sk-learn, risk-averse, desk-lamp",
        "ghp_short",
        "eyJhbGciOiJIUzI1NiJ9 alone",
    ],
)
def test_text_that_only_resembles_a_credential_is_kept(text: str) -> None:
    assert Redactor().text(text) == text
    assert not looks_like_secret(text)


def test_a_credential_used_as_a_key_is_scrubbed_and_named_keys_lose_their_values() -> None:
    key = "sk-proj-" + "q7" * 12
    data = {
        "metadata": {key: "v", "clientSecret": "x", "awsSecretAccessKey": "y", "note": "ok"},
        "tools": [{"parameters": {"properties": {f"bearer {JWT}": {"type": "string"}}}}],
        "accessToken": "z",
        "monkey": 1,
    }
    scrubbed = Redactor().data(data)
    text = json.dumps(scrubbed)
    assert key not in text and JWT not in text and '"x"' not in text and '"z"' not in text
    assert scrubbed["metadata"][REDACTED] == "v"
    assert scrubbed["metadata"]["note"] == "ok" and scrubbed["monkey"] == 1
    assert scrubbed["tools"][0]["parameters"]["properties"] == {REDACTED: {"type": "string"}}


@pytest.mark.parametrize(
    ("key", "named"),
    [
        ("SecretAccessKey", True),
        ("aws_secret_access_key", True),
        ("clientSecret", True),
        ("refreshToken", True),
        ("Proxy-Authorization", True),
        ("secretary", False),
        ("tokens", False),
        ("keyword", False),
    ],
)
def test_keys_naming_a_credential_in_any_spelling(key: str, named: bool) -> None:
    assert names_a_secret(key) is named


def test_scrubbing_long_prose_costs_a_few_substring_searches() -> None:
    """A long chat's messages are scrubbed on every call: the shapes cost a few substring
    searches over 1 MB of prose (about 6 ms), even with the marks of the case-insensitive ones
    ('bearer', 'secret') in it; trying those patterns at every character took about 40 ms."""
    prose = "The quick brown fox jumps over the lazy dog. " * 23_000
    prose += "A bearer bond is a secret access path. "
    redactor = Redactor(["my-master-key-123"])
    start = time.thread_time()
    assert redactor.text(prose) == prose
    assert time.thread_time() - start < 0.03


def test_dagster_samples_are_scrubbed_before_their_cells_are_cut() -> None:
    """Dagster keeps materialization metadata in its own storage; a cell cut at 80 characters
    would otherwise keep the part of a credential the cut leaves, which no shape matches."""
    rows = pl.DataFrame({"text": ["x " * 10 + f"authorization: bearer {JWT}", "bearer tokens"]})
    table = markdown_table(rows)
    assert JWT[:8] not in table and "bearer tokens" in table


def test_trying_shapes_only_at_their_marks_scrubs_what_the_whole_patterns_do() -> None:
    """The marks are a shortcut: on strings drawn from the pieces credentials are made of,
    the redactor scrubs exactly what every pattern applied to the whole string scrubs."""
    draw = random.Random(7)
    pieces = ["bearer ", "BeArEr\t", "sk-", "eyJ", "abcdefgh", "0123456789", ".", " ", "x_"]
    pieces += ["ASIA", "AKIA", "IOSFODNN7EXAMPLE", "ghp_", "github_pat_", "A1" * 18, "İ"]
    pieces += ["Secret_Access_Key=", '": "', AWS_SECRET, "aws", "secret"]
    found = 0
    for _ in range(5_000):
        text = "".join(draw.choices(pieces, k=draw.randint(1, 10)))
        whole = text
        for shape in CREDENTIAL_SHAPES:
            whole = shape.pattern.sub(lambda m: (m.groupdict().get("name") or "") + REDACTED, whole)
        assert Redactor().text(text) == whole, text
        found += whole != text
    assert found > 500
