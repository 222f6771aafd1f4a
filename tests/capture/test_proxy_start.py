"""``claw proxy`` refuses to start, with one clear line and a non-zero exit, when it could not
serve what it promises: its port is taken, its backend does not say which model it serves, or
its lake cannot be written; and ``--no-capture`` runs the plain proxy."""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path

import openai
from stack_fixtures import PROXY_START_TIMEOUT_S, capture_env, refused_start

from claw_pipelines.access import STRONG_KEY_HINT
from claw_pipelines.lake import Lake
from claw_pipelines.processes import free_port
from claw_pipelines.stack import start_engine, start_proxy


def test_a_taken_port_is_one_clear_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        line = refused_start(tmp_path, "proxy", "--port", str(port))
    assert line == (
        f"claw proxy: cannot bind 127.0.0.1:{port} (Address already in use); stop what holds "
        "it or pick another port with --port"
    )


def test_a_backend_that_does_not_answer_is_refused(tmp_path: Path) -> None:
    backend = f"http://127.0.0.1:{free_port()}/v1"
    line = refused_start(tmp_path, "proxy", "--port", str(free_port()), "--backend", backend)
    assert line.startswith(f"claw proxy: backend {backend}/models did not answer (")
    assert line.endswith("); start it first, or name its model with --backend-model")


def test_a_lake_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    in_the_way = tmp_path / "a-file-where-the-lake-should-go"
    in_the_way.write_text("")
    lake = in_the_way / "lake"
    line = refused_start(
        tmp_path, "proxy", "--port", str(free_port()), env={"CLAW_LAKE_URI": str(lake)}
    )
    assert line.startswith(f"claw proxy: cannot write to the lake {lake} (")
    assert line.endswith("); fix CLAW_LAKE_URI or CLAW_STORAGE_OPTIONS")


def test_a_non_loopback_bind_needs_a_strong_master_key(tmp_path: Path) -> None:
    """Long is not enough: 40 repeated characters are as weak as 23."""
    for key in ("k" * 23, "k" * 40):
        weak = refused_start(
            tmp_path, "proxy", "--host", "0.0.0.0", "--port", str(free_port()),
            env={"LITELLM_MASTER_KEY": key},
        )  # fmt: skip
        assert weak == (
            "claw proxy: refusing to bind 0.0.0.0 with a weak LITELLM_MASTER_KEY; "
            + STRONG_KEY_HINT
        )
    # A random key passes: what stops this start is its port, held here (bound, never listening).
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        port = held.getsockname()[1]
        strong = refused_start(
            tmp_path, "proxy", "--host", "0.0.0.0", "--port", str(port),
            env={"LITELLM_MASTER_KEY": secrets.token_urlsafe(24)},
        )  # fmt: skip
    assert strong.startswith(f"claw proxy: cannot bind 0.0.0.0:{port} ")


def test_the_plain_proxy_answers_and_lands_nothing(tmp_path: Path) -> None:
    """``claw proxy --no-capture`` (the capture benchmark's baseline, LiteLLM's app behind the
    heap freeze only) starts for real, answers a chat call and writes no turn."""
    key = "sk-test-" + secrets.token_hex(16)
    env = capture_env(tmp_path, key)
    engine = start_engine(free_port(), tmp_path, env)
    proxy = None
    try:
        engine.wait_ready("/health", timeout_s=60)
        proxy = start_proxy(free_port(), tmp_path, f"{engine.url}/v1", env, capture=False)
        proxy.wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 2 + 2?"}]
        )
        assert answer.choices[0].message.content
        time.sleep(1.0)  # longer than the flush interval a capture proxy would commit within
        assert Lake(env["CLAW_LAKE_URI"]).open("turns") is None
        assert not any(Path(env["CLAW_SPOOL_DIR"]).rglob("*.spool"))
    finally:
        if proxy is not None:
            proxy.stop()
        engine.stop()
