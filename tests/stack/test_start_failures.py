"""``claw up`` never reports a stack that is not its own: a taken port or a refused recipe fails
before anything starts, and a readiness poll answered by a foreign server fails instead of
passing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from claw_pipelines import stack
from claw_pipelines.processes import ServiceStartError, free_port, probe_bind
from claw_pipelines.settings import get_settings
from claw_pipelines.stack import PortRequest, check_ports, start_engine

CLI = [sys.executable, "-m", "claw_pipelines.cli"]
REPO = Path(__file__).resolve().parents[2]


class _AnswersEverything(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign_server() -> Iterator[int]:
    """Another program's HTTP server on a loopback port, answering 200 to every GET."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_claw_up_refuses_a_taken_port_before_starting_anything(
    tmp_path: Path, foreign_server: int
) -> None:
    others = {name: free_port() for name in ("dagster", "inspector", "engine")}
    command = [
        *CLI,
        "up",
        f"--proxy-port={foreign_server}",
        *[f"--{name}-port={port}" for name, port in others.items()],
    ]
    up = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output, _ = up.communicate(timeout=300)
    assert up.returncode != 0, output
    assert "is up" not in output
    last_line = output.strip().splitlines()[-1]
    assert last_line.startswith(
        f"claw up: cannot bind the capture proxy to 127.0.0.1:{foreign_server}"
    )
    assert "--proxy-port" in last_line
    assert _group_gone(up.pid)
    for port in others.values():
        probe_bind("127.0.0.1", port)


def test_two_services_on_one_port_are_refused() -> None:
    port = free_port()
    requests = [
        PortRequest("capture proxy", "127.0.0.1", port, "--proxy-port"),
        PortRequest("Dagster UI", "127.0.0.1", port, "--dagster-port"),
    ]
    with pytest.raises(ServiceStartError, match="--proxy-port or --dagster-port"):
        check_ports(requests)


def test_a_foreign_server_does_not_pass_for_a_service(tmp_path: Path, foreign_server: int) -> None:
    """The race the early check cannot close: the port is taken after it, before the bind."""
    engine = start_engine(foreign_server, tmp_path)
    try:
        with pytest.raises(
            ServiceStartError, match=f"port {foreign_server} is answered by another"
        ):
            engine.wait_ready("/health", timeout_s=60)
    finally:
        engine.stop()


def test_claw_up_refuses_a_useless_recipe_before_starting_anything(tmp_path, monkeypatch) -> None:
    """The recipes of the user's config folder (CLAW_CONFIG_DIR) are the ones checked."""
    (tmp_path / "batches.yaml").write_text(
        "recipes:\n  - {name: solo, algorithm: grpo, group_size: 1}\n"
    )
    monkeypatch.setenv("CLAW_CONFIG_DIR", str(tmp_path))
    get_settings.cache_clear()

    def refuse_to_start(*args, **kwargs):
        raise AssertionError("claw up started a service under a refused recipe")

    monkeypatch.setattr(stack, "check_ports", refuse_to_start)
    try:
        with pytest.raises(SystemExit, match=r"^claw up: ") as refused:
            stack.run_stack("127.0.0.1", free_port(), free_port(), free_port(), free_port())
    finally:
        get_settings.cache_clear()
    assert f"claw up: {tmp_path / 'batches.yaml'}: " in str(refused.value)
    assert "recipe 'solo': group_size" in str(refused.value)


def test_make_refuses_a_python_older_than_3_11_before_building_anything(tmp_path: Path) -> None:
    """Both set-up commands build `.venv` first; an older `python3` fails there with one line,
    not halfway through installing the lock."""
    for name in ("Makefile", "requirements.lock", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    old_python = tmp_path / "python3.10"
    old_python.write_text(
        "#!/bin/sh\n"
        f'exec {sys.executable} -c "import sys; sys.version_info = (3, 10, 14); '
        'sys.version = \'3.10.14\'; exec(sys.argv[1])" "$2"\n'
    )
    old_python.chmod(0o755)
    done = subprocess.run(
        ["make", "test", f"PYTHON={old_python}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "claw-pipelines needs Python >= 3.11" in done.stderr
    assert "is 3.10.14" in done.stderr
    assert not (tmp_path / ".venv").exists()
