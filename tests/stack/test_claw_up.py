"""The README's main command: ``claw up`` brings everything up, ``claw demo --online`` yields GRPO
batches without anyone clicking and trains on them (pause, announce, ack), and Ctrl-C stops
every process ``claw up`` started. It runs with ``--compat claw-r1``, which ``claw up`` passes on
to the proxy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import polars as pl
import psutil
import pytest
from stack_fixtures import kill_leftovers, stopped_by_ctrl_c
from typer.testing import CliRunner

from claw_pipelines.cli import app
from claw_pipelines.demo_trainer import CONSUMER
from claw_pipelines.lake import Lake
from claw_pipelines.processes import free_port, start_service
from claw_pipelines.settings import LOCAL_MASTER_KEY
from claw_pipelines.stack import POOL_CLAIM_GRACE, POOL_CLAIM_GRACE_S

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
        assert_run_queue_grace(children)
        init = httpx.post(f"{proxy_url}/init_trajectory", timeout=30)
        assert init.status_code == 200, init.text
        assert init.json()["base_url"].startswith(f"{proxy_url}/{init.json()['trajectory_uid']}/")

        online = [*CLI, "demo", "--online", "--train-steps", "2", "--train-s", "0.5"]
        demo = subprocess.run(
            [*online, "--prompts", "8", "--rollouts", "4", "--proxy-url", proxy_url],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=420,
            check=False,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert " 0 with errors" in demo.stdout, demo.stdout
        assert "2 batches, policy versions [1, 2]" in demo.stdout, demo.stdout

        lake = Lake(str(tmp_path / ".claw" / "lake"))
        assert batch_rows(lake) > 0
        acks = lake.scan("batch_consumption/grpo").collect()
        assert acks.filter(pl.col("consumer") == CONSUMER)["trainer_step"].sort().to_list() == [
            1,
            2,
        ]
        announced = lake.scan("policy_versions").filter(pl.col("event") == "announce").collect()
        assert sorted(announced["version"]) == [1, 2]
        assert_next_turn_carries_version(proxy_url, lake, 2)

        left = stopped_by_ctrl_c(up, children)
        assert not left, f"processes left running after Ctrl-C: {left}"
    finally:
        kill_leftovers(up, children)


def assert_run_queue_grace(children: list[psutil.Process]) -> None:
    """The daemon's run queue counts a started run as holding its first pool for
    ``POOL_CLAIM_GRACE_S``, not Dagster's 5 s."""
    daemons = [child for child in children if "dagster._daemon" in " ".join(child.cmdline())]
    assert daemons, [child.cmdline() for child in children]
    assert {daemon.environ().get(POOL_CLAIM_GRACE) for daemon in daemons} == {POOL_CLAIM_GRACE_S}


def assert_next_turn_carries_version(proxy_url: str, lake: Lake, version: int) -> None:
    """A call answered after the trainer's last announce lands under its version."""
    key = os.environ.get("LITELLM_MASTER_KEY", LOCAL_MASTER_KEY)
    response = httpx.post(
        f"{proxy_url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "policy", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
        timeout=60,
    )
    response.raise_for_status()
    turn_id = response.headers["x-litellm-call-id"]

    def landed() -> pl.LazyFrame:
        scan = lake.scan("turns")
        return pl.LazyFrame() if scan is None else scan.filter(pl.col("turn_id") == turn_id)

    wait_for(lambda: landed().collect().height == 1, 60, f"turn {turn_id}")
    assert landed().collect()["policy_version"].to_list() == [version]


def test_claw_up_help_says_only_the_proxy_leaves_loopback() -> None:
    """``run_stack`` binds ``--host`` for the capture proxy alone: the help must say so."""
    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    help_text = " ".join(result.output.split())
    assert "Interface the capture proxy binds; the other services stay on loopback." in help_text
