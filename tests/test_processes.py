"""Ports for services started side by side by several processes (two pytest workers)."""

from __future__ import annotations

import subprocess
import sys

from claw_pipelines.processes import free_port

REOFFERED = """
import socket, sys, types
from claw_pipelines import processes

class Reoffered(socket.socket):
    offers = [int(sys.argv[1])]

    def getsockname(self):
        return ("127.0.0.1", self.offers.pop()) if self.offers else super().getsockname()

processes.socket = types.SimpleNamespace(
    socket=Reoffered, AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM
)
print(processes.free_port())
"""
"""``free_port`` in a process whose first ``bind(0)`` gets the given port back from the kernel,
as it may until that port's service binds it."""


def test_a_port_another_process_picked_is_not_handed_out_before_its_service_binds() -> None:
    picked = free_port()
    other = subprocess.run(
        [sys.executable, "-c", REOFFERED, str(picked)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert int(other.stdout) != picked
