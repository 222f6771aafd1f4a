"""``claw proxy`` refuses to start, with one clear line and a non-zero exit, when it could not
serve what it promises: its port is taken, its backend does not say which model it serves, or
its lake cannot be written."""

from __future__ import annotations

import socket
from pathlib import Path

from stack_fixtures import refused_start

from claw_pipelines.processes import free_port


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


def test_a_non_loopback_bind_needs_a_master_key_of_24_characters(tmp_path: Path) -> None:
    weak = refused_start(
        tmp_path, "proxy", "--host", "0.0.0.0", "--port", str(free_port()),
        env={"LITELLM_MASTER_KEY": "k" * 23},
    )  # fmt: skip
    assert weak == (
        "claw proxy: refusing to bind 0.0.0.0 with a weak LITELLM_MASTER_KEY; use a random key "
        "of >= 24 characters"
    )
    # 24 characters pass: what stops this start is its port, held here (bound, never listening).
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        port = held.getsockname()[1]
        strong = refused_start(
            tmp_path, "proxy", "--host", "0.0.0.0", "--port", str(port),
            env={"LITELLM_MASTER_KEY": "k" * 24},
        )  # fmt: skip
    assert strong.startswith(f"claw proxy: cannot bind 0.0.0.0:{port} ")
