"""Installing a real agent CLI from the npm registry, running it offline, and checking its rows.

Each CLI is pinned to the exact version whose requests and offline settings were recorded (see
docs/agents.md): these CLIs change weekly (new outbound calls, config keys, request shapes), and
an unpinned install would make the test follow whatever the registry published last. Bump a pin
on purpose and re-check the offline settings with it.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from agent_relay import Exchange, OutboundGuard, Relay
from stack_fixtures import CaptureStack

NPM_INSTALL_TIMEOUT_S = 600
CLI_TIMEOUT_S = 300
ROW_TIMEOUT_S = 60


@dataclass(frozen=True)
class NpmCli:
    """An agent CLI published on npm: the package, its pinned version and its command."""

    package: str
    version: str
    command: str

    def install(self, cache: Path) -> Path:
        """The CLI's executable, installed under ``cache`` with ``npm install --prefix``.

        Installed once per version (its own prefix), checked by running ``--version``. A failed
        install fails the test with npm's output: the registry is part of the test's set-up.
        """
        prefix = cache / f"{self.package.replace('/', '+')}@{self.version}"
        executable = prefix / "node_modules" / ".bin" / self.command
        if not executable.exists():
            command = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund"]
            done = _run([*command, f"{self.package}@{self.version}"], NPM_INSTALL_TIMEOUT_S)
            if done.returncode != 0 or not executable.exists():
                pytest.fail(
                    f"npm install {self.package}@{self.version} failed "
                    f"(exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
        version = _run([str(executable), "--version"], 60, env=_path_env())
        if self.version not in version.stdout:
            pytest.fail(f"{executable} --version says {version.stdout!r}, not {self.version}")
        return executable


def _run(command: list[str], timeout_s: float, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
        **kwargs,
    )


def _path_env() -> dict[str, str]:
    """A PATH with node (npm's launchers are node scripts) and the system's basic tools."""
    node = shutil.which("node")
    return {"PATH": os.pathsep.join(filter(None, [node and str(Path(node).parent), os.defpath]))}


def run_offline(
    command: list[str], home: Path, cwd: Path, guard: OutboundGuard, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """Run a CLI with nothing of the machine's environment: its own HOME, only ``env``, and
    every proxy-aware outbound request sent to ``guard``."""
    base = {**_path_env(), "HOME": str(home), "TERM": "dumb", **guard.proxy_env()}
    done = _run(command, CLI_TIMEOUT_S, env=base | env, cwd=cwd)
    assert done.returncode == 0, f"{command[0]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done


def model_calls(relay: Relay, route: str) -> list[Exchange]:
    """The exchanges on the model route; every exchange must be one, answered 200."""
    assert relay.exchanges, "the agent sent nothing to the proxy"
    for exchange in relay.exchanges:
        assert exchange.method == "POST" and route in exchange.path, exchange
        assert exchange.status == 200, exchange
        assert exchange.call_id, exchange
    return relay.exchanges


def assert_landed_engine_exact(
    stack: CaptureStack, calls: list[Exchange], trajectory: str, api: str
) -> pl.DataFrame:
    """Every answered call landed once in ``trajectory`` with the engine's exact IDs and
    logprobs, and no other row did; returns the rows in call order."""
    call_ids = [call.call_id for call in calls]
    rows = stack.wait_for_rows(
        lambda df: set(call_ids) <= set(df["turn_id"]), timeout_s=ROW_TIMEOUT_S
    ).filter(pl.col("trajectory_id") == trajectory)
    assert sorted(rows["turn_id"]) == sorted(call_ids)
    answers = stack.engine_answers()
    for row in rows.iter_rows(named=True):
        assert (row["api"], row["status"], row["token_source"]) == (api, "success", "engine")
        assert json.loads(row["api_request"])["model"] == "policy"
        sent = answers[json.loads(row["api_response"])["id"]]
        assert row["prompt_token_ids"] == sent["prompt_token_ids"]
        assert row["response_token_ids"] == sent["token_ids"]
        assert row["response_logprobs"] == pytest.approx(sent["logprobs"], rel=1e-6)
    order = {call_id: position for position, call_id in enumerate(call_ids)}
    return rows.sort(pl.col("turn_id").replace_strict(order))


def assert_conversation_extends(rows: pl.DataFrame) -> None:
    """Each call's prompt is the previous prompt and response, token for token, and more."""
    turns = rows.to_dicts()
    for before, after in itertools.pairwise(turns):
        context = before["prompt_token_ids"] + before["response_token_ids"]
        assert after["prompt_token_ids"][: len(context)] == context
        assert len(after["prompt_token_ids"]) > len(context)
