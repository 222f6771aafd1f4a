"""A DPO batch trains in TRL's DPOTrainer on the engine's token IDs: the batch is written,
exported and loaded as a trainer does (``Batch.load``), its ``preference_tokens`` dataset saved,
and one training step runs in a venv that has trl and torch (``dpo_step.py``), which the project
venv has not.

The venv is built once and kept in pytest's cache (``.pytest_cache/d/``): torch from a local
CPU wheel file (``CLAW_TORCH_WHEELS``, default /opt/wheels), so a CUDA build is
never downloaded, trl and the rest from the package index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from claw_pipelines.batches.names import exports_folder
from claw_pipelines.batches.recipe import Recipe
from claw_pipelines.batches.rows import completed_chunks, stored_rows
from claw_pipelines.batching.building import write_batch
from claw_pipelines.batching.planner import plan_batch
from claw_pipelines.exporters import Destination, export_chunks
from claw_pipelines.lake import Lake
from claw_pipelines.schemas import TrajectoryEventRow, Turn, rows_to_arrow
from claw_pipelines.trainer import Batch
from claw_pipelines.transforms import (
    QualityConfig,
    curate_steps,
    extract_steps,
    reward_steps,
    score_steps,
)
from claw_pipelines.transforms.reward_rules import RewardConfig

TORCH = "2.13.0+cpu"
TRL = "trl==1.16.0"
"""The versions ``claw_pipelines.trainer.dpo`` was written against (it overrides a private
method of ``DPOTrainer``)."""

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DPO = Recipe(name="dpo", algorithm="dpo", groups_per_batch=2, min_reward_gap=0.5,
             filters={"min_quality": 0})  # fmt: skip


@pytest.fixture(scope="module")
def trl_python(request: pytest.FixtureRequest) -> Path:
    """The python of a venv with torch (CPU) and trl, built on first use."""
    wheels = Path(os.environ.get("CLAW_TORCH_WHEELS", "/opt/wheels"))
    torch = sorted(wheels.glob(f"torch-{TORCH}-*.whl"))
    if not torch:
        pytest.skip(f"no torch {TORCH} wheel in {wheels} (CLAW_TORCH_WHEELS)")
    venv = request.config.cache.mkdir("trl-venv")
    python, ready = venv / "bin" / "python", venv / "installed.txt"
    wanted = f"{torch[-1].name} {TRL}"
    if ready.exists() and ready.read_text() == wanted:
        return python
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    # torch named by its wheel file: pip takes no other build of it (never a CUDA one);
    # --no-compile: byte-compiling all of torch took 2 of the 3.8 minutes
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-compile", str(torch[-1]), TRL], check=True)  # fmt: skip
    ready.write_text(wanted)
    print(f"built {venv} in {time.monotonic() - started:.0f} s")
    return python


def _pair_turns(group: str, prompt: list[int], replies: dict[str, list[int]]) -> list[dict]:
    """One single-call trajectory per reply, all from the same prompt."""
    rows = []
    for i, (trajectory_id, reply) in enumerate(replies.items()):
        at = T0 + timedelta(seconds=i)
        rows.append(
            Turn(
                turn_id=f"{trajectory_id}-0", trajectory_id=trajectory_id, group_id=group,
                agent="solver", policy_version=1, model="policy", token_source="engine",
                finish_reason="stop", prompt_token_ids=prompt, response_token_ids=reply,
                response_logprobs=[-0.5] * len(reply), started_at=at,
                ended_at=at + timedelta(seconds=1),
                request_messages=json.dumps([{"role": "user", "content": f"task {group}"}]),
                response_message=json.dumps({"role": "assistant", "content": trajectory_id}),
            ).model_dump()
        )  # fmt: skip
    return rows


def _dpo_batch(lake: Lake) -> Batch:
    """Two groups of a chosen and a rejected reply, landed, planned, written and exported as
    the batch assets do, and loaded as a trainer does."""
    rows = [*_pair_turns("g", [1000, 1001, 1002], {"g-good": [7, 8, 9], "g-bad": [10]}),
            *_pair_turns("h", [1500, 1501], {"h-good": [11], "h-bad": [12, 13]})]  # fmt: skip
    rewards = {"g-good": 1.0, "g-bad": 0.0, "h-good": 1.0, "h-bad": 0.0}
    events = [TrajectoryEventRow(trajectory_id=t, group_id=t[0], reward=r,
                                 created_at=T0 + timedelta(minutes=5)).model_dump()
              for t, r in rewards.items()]  # fmt: skip
    lake.append("turns", rows_to_arrow(Turn, rows))
    landed = pl.from_arrow(rows_to_arrow(TrajectoryEventRow, events))
    turns = pl.from_arrow(rows_to_arrow(Turn, rows))
    steps = extract_steps(turns, None, landed, now=T0 + timedelta(minutes=10)).steps
    rewarded = reward_steps(steps, None, landed, RewardConfig())
    curated = curate_steps(score_steps(rewarded, steps, QualityConfig()), None).collect()
    plan = plan_batch(DPO, curated, lake.scan_landed("turns"), None, T0 + timedelta(hours=1))
    assert plan.ready
    write_batch(lake, DPO, plan)
    stored = stored_rows(lake, DPO.name, DPO.algorithm, plan.batch_id)
    out = Destination(lake.uri(f"{exports_folder(DPO.name)}/{plan.batch_id}"))
    export_chunks(DPO, completed_chunks(lake, DPO.algorithm, stored, DPO.layout), out)
    return Batch.load(lake, DPO.name, plan.batch_id)


def test_dpo_trainer_trains_on_the_batch_engine_ids(tmp_path: Path, trl_python: Path):
    batch = _dpo_batch(Lake(str(tmp_path / "lake")))
    dataset = batch.to_trl("preference_tokens")
    pairs = [(p, c, r) for p, c, r in zip(dataset["prompt_ids"], dataset["chosen_ids"],
                                          dataset["rejected_ids"], strict=True)]  # fmt: skip
    assert sorted(pairs) == [([1000, 1001, 1002], [7, 8, 9], [10]), ([1500, 1501], [11], [12, 13])]
    dataset.to_parquet(tmp_path / "preference_tokens.parquet")
    started = time.monotonic()
    run = subprocess.run(
        [str(trl_python), str(ROOT / "tests/trainer/dpo_step.py"),
         str(tmp_path / "preference_tokens.parquet"), str(ROOT / "claw_pipelines/trainer/dpo.py"),
         str(tmp_path / "dpo")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    print(f"dpo step in {time.monotonic() - started:.0f} s")
    step = json.loads(run.stdout.strip().splitlines()[-1])
    # stock DPOTrainer prepares the token columns as text: the failure the subclass avoids
    assert step["stock_error"] == "KeyError: 'chosen'"
    assert step["steps"] == 1 and step["loss"] == pytest.approx(0.6931, abs=1e-3)  # log 2
    # the collator's rows: every pair's prompt + chosen, then prompt + rejected, engine IDs
    chosen = [p + c for p, c, _ in pairs]
    rejected = [p + r for p, _, r in pairs]
    half = len(pairs)
    assert sorted(step["sequences"][:half]) == sorted(chosen)
    assert sorted(step["sequences"][half:]) == sorted(rejected)
    assert sorted(step["completions"]) == sorted([c for _, c, _ in pairs] + [r for *_, r in pairs])
