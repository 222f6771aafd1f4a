"""Start and stop the services (engine, proxy, Dagster, inspector) as process groups.

``claw up``, the tests and the benchmarks share this, so every service is started on loopback,
waited for over HTTP, and stopped by process group (``dagster dev`` can hang on SIGTERM, so a
group that does not exit in time is killed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class Service:
    """A started service: its process (leader of its own group), log file and base URL."""

    name: str
    process: subprocess.Popen
    log_path: Path
    url: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def wait_ready(self, path: str, timeout_s: float = 120.0) -> None:
        """Poll ``url + path`` until it answers 2xx; fail with the log tail if it dies or hangs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + path, timeout=2.0).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        stop_group(self.process, grace_s)


def start_service(
    name: str,
    command: list[str],
    url: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Service:
    """Start ``command`` as the leader of a new process group, output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("ab")
    process = subprocess.Popen(
        command,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    log_file.close()
    return Service(name, process, log_path, url)


def stop_group(process: subprocess.Popen, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Signal the whole process group, then SIGKILL whatever is left after ``grace_s``."""
    if process.poll() is not None and not _group_alive(process.pid):
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process.poll() is not None and not _group_alive(process.pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
