"""Every benchmark in ``bench/`` runs its whole path at a tiny size (``--quick``) and prints its
one JSON object, so none can rot unnoticed (bench/inspector.py once failed on a column the
``turns`` schema gained, and nothing ran it). A new ``bench/*.py`` is picked up by the glob.

Each bench runs as the leader of its own process group (the services it starts are its
children), stopped as a group when it overruns; tests/conftest.py schedules each bench as its
own unit, so the two xdist workers share them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from claw_pipelines.processes import stop_group

BENCH = Path(__file__).resolve().parents[2] / "bench"
TIMEOUT_S = 540
"""A quick run takes seconds to a minute on a loaded machine; a bench that starts the whole
stack (Dagster's first run included) can take a few: past this it hangs (below pytest-timeout's
600 s, so the failure says which bench)."""


@pytest.mark.parametrize("bench", sorted(BENCH.glob("*.py")), ids=lambda path: path.stem)
def test_a_quick_run_prints_one_json_object(bench: Path, tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, str(bench), "--quick"],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr").open("wb"),
        stdin=subprocess.DEVNULL,
        cwd=BENCH.parent,
        start_new_session=True,
        text=True,
    )
    try:
        stdout, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_group(process)
        pytest.fail(f"{bench.name} --quick ran past {TIMEOUT_S} s")
    finally:
        stop_group(process, grace_s=5)
    stderr = (tmp_path / "stderr").read_text(errors="replace")[-4000:]
    assert process.returncode == 0, f"{bench.name} --quick exited {process.returncode}:\n{stderr}"
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, f"{bench.name} printed {len(lines)} lines, not one JSON object"
    measured = json.loads(lines[0])
    assert isinstance(measured, dict) and measured, f"{bench.name} printed {lines[0]!r}"
