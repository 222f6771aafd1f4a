"""The README's main command: ``claw up`` brings everything up, ``claw demo`` yields a GRPO batch
without anyone clicking, and Ctrl-C stops every process ``claw up`` started. It runs with
``--compat claw-r1``, which ``claw up`` passes on to the proxy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from claw_pipelines.cli import app
from claw_pipelines.lake import Lake
from claw_pipelines.processes import free_port, start_service, stop_group

CLI = [sys.executable, "-m", "claw_pipelines.cli"]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(1)


def batch_rows(lake: Lake) -> int:
    scan = lake.scan("batches/grpo")
    return 0 if scan is None else scan.select("batch_id").collect().height


def test_claw_up_demo_batch_and_clean_stop(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("proxy", "dagster", "inspector", "engine")}
    command = [*CLI, "up", *[f"--{name}-port={port}" for name, port in ports.items()]]
    command.append("--compat=claw-r1")  # passed on to the proxy: Claw-R1's routes, keyless
    up = start_service("claw-up", command, "", tmp_path / "up.log", cwd=tmp_path)
    children: list[psutil.Process] = []
    try:
        wait_for(
            lambda: "claw-pipelines is up" in up.log_tail(10_000) or not up.alive(), 420, "claw up"
        )
        assert up.alive(), up.log_tail()
        proxy_url = f"http://127.0.0.1:{ports['proxy']}"
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 4, "engine, proxy, dagster and inspector"
        init = httpx.post(f"{proxy_url}/init_trajectory", timeout=30)
        assert init.status_code == 200, init.text
        assert init.json()["base_url"].startswith(f"{proxy_url}/{init.json()['trajectory_uid']}/")

        demo = subprocess.run(
            [*CLI, "demo", "--prompts", "8", "--rollouts", "4", "--proxy-url", proxy_url],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "32 ok / 0 with errors" in demo.stdout, demo.stdout

        lake = Lake(str(tmp_path / ".claw" / "lake"))
        wait_for(lambda: batch_rows(lake) > 0, 300, "the first GRPO batch")

        os.kill(up.pid, signal.SIGINT)
        up.process.wait(timeout=120)
        time.sleep(1)
        left = [p.pid for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes left running after Ctrl-C: {left}"
    finally:
        stop_group(up.process, grace_s=5)
        for child in children:
            if child.is_running():
                child.kill()


def test_claw_up_help_says_only_the_proxy_leaves_loopback() -> None:
    """``run_stack`` binds ``--host`` for the capture proxy alone: the help must say so."""
    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    help_text = " ".join(result.output.split())
    assert "Interface the capture proxy binds; the other services stay on loopback." in help_text
