"""Start and stop the services (engine, proxy, Dagster, inspector) as process groups.

``claw up``, the tests and the benchmarks share this, so every service is started on loopback,
waited for over HTTP, and stopped by process group (``dagster dev`` can hang on SIGTERM, so a
group that does not exit in time is killed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil


class ServiceStartError(RuntimeError):
    """A service cannot start, or what answers on its port is not it; the message says why."""


PORT_LEASES = Path(tempfile.gettempdir()) / f"claw-pipelines-port-leases-{os.getuid()}.json"
PORT_LEASE_S = 600.0
"""How long a port from ``free_port`` is not handed out again: a LiteLLM proxy binds its port
10-40 s after it was picked (minutes on a busy machine)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, leased to the caller for ``PORT_LEASE_S``.

    The kernel hands a released port out again to the next ``bind(0)``, so two processes
    picking ports (test workers, benchmarks, several checkouts) could both get one before either
    service binds it. Every ``free_port`` of this user on this machine skips the leased ports.
    """
    with _port_leases() as leases:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in leases:
                leases[port] = time.time() + PORT_LEASE_S
                return port


@contextlib.contextmanager
def _port_leases() -> Iterator[dict[int, float]]:
    """The unexpired leases (port: expiry), held under an exclusive lock and written back."""
    with PORT_LEASES.open("a+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        try:
            stored = json.loads(file.read() or "{}")
        except json.JSONDecodeError:  # a writer killed mid-write: its leases are lost
            stored = {}
        now = time.time()
        leases = {int(port): expiry for port, expiry in stored.items() if expiry > now}
        yield leases
        file.seek(0)
        file.truncate()
        json.dump(leases, file)


def probe_bind(host: str, port: int) -> None:
    """Bind and release ``host:port`` as uvicorn would, raising the ``OSError`` it would get.

    SO_REUSEADDR, as uvicorn sets it, so connections lingering in TIME_WAIT after a previous
    server do not count as taking the port.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


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

    @property
    def port(self) -> int:
        return httpx.URL(self.url).port

    def listens_on_port(self) -> bool:
        """Whether a process of this service (the leader or a descendant) listens on its port."""
        try:
            leader = psutil.Process(self.pid)
            processes = [leader, *leader.children(recursive=True)]
        except psutil.NoSuchProcess:
            return False
        for process in processes:
            try:
                sockets = process.net_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(s.status == psutil.CONN_LISTEN and s.laddr.port == self.port for s in sockets):
                return True
        return False

    def wait_ready(self, path: str, timeout_s: float = 120.0) -> None:
        """Poll ``url + path`` until this service answers 2xx; fail with the log tail if it dies
        or hangs.

        An answer counts only if one of this service's processes listens on the port: a foreign
        server that already held it would otherwise pass for this one (whose own bind fails).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(self.url + path, timeout=2.0)
            except httpx.HTTPError:
                answer = None
            if answer is not None and not self.listens_on_port():
                raise ServiceStartError(
                    f"port {self.port} is answered by another program, not by {self.name}; "
                    f"stop it or pick another port for {self.name}:\n{self.log_tail()}"
                )
            if answer is not None and answer.is_success:
                return
            if not self.alive():
                raise ServiceStartError(f"{self.name} exited early:\n{self.log_tail()}")
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
