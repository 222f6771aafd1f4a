"""A full spool disk: calls that cannot be spooled get 503 + Retry-After, every 200 still lands
(during the shortage and after space is freed), and the shortage is logged once per episode.

The spool is a 4 MiB tmpfs that a ballast file fills but for 32 KiB while clients call the
proxy, so writes fail whole and part way (a short ``write``), as on a real disk that fills up.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from spool_faults import Ballast, small_tmpfs
from stack_fixtures import CaptureStack, launch_stack

from claw_pipelines.processes import stop_group

CLIENTS = 16
DEADLINE_S = 180


@dataclass
class Outcomes:
    """Every answer the clients got, by kind."""

    turns: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    """White-box steps: ``/claw/v1`` rows that close nothing (a reward or a completion would
    have the flusher commit at once, so the spool would never fill)."""
    refused: list[httpx.Response] = field(default_factory=list)
    """Answers other than 200 (a dropped connection as a 599)."""

    @property
    def answered(self) -> int:
        return len(self.turns) + len(self.steps)


async def _client(stack: CaptureStack, index: int, outcomes: Outcomes, stop: threading.Event):
    headers = {"authorization": f"Bearer {stack.key}"}
    chat = {"model": "policy", "messages": [{"role": "user", "content": "What is 5 + 6?"}]}
    async with httpx.AsyncClient(base_url=stack.proxy_url, headers=headers, timeout=300) as client:
        for call in itertools.count():
            if stop.is_set():
                return
            try:
                if call % 3 == 2:
                    body = {"prompt_token_ids": [1, 2], "response_token_ids": [3]}
                    response = await client.post("/claw/v1/steps", json=body)
                else:
                    path = f"/t/full-{index}/g/v1/chat/completions"
                    response = await client.post(path, json=chat)
            except httpx.TransportError as error:  # a dropped connection is refused too
                response = httpx.Response(599, text=repr(error))
            if response.status_code == 200:
                answered = outcomes.steps if call % 3 == 2 else outcomes.turns
                answered.append(response.headers["x-litellm-call-id"])
            else:
                outcomes.refused.append(response)
                await asyncio.sleep(0.05)


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {DEADLINE_S} s")
        time.sleep(0.1)


def test_a_full_spool_disk_answers_503_and_every_200_lands(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with small_tmpfs(spool):
        # A flush every 2 s under the clients' continuous load (its longest wait): between two,
        # they write more than the 32 KiB left free.
        flush_every_2_s = {"CLAW_FLUSH_INTERVAL_S": "2", "CLAW_FLUSH_MAX_WAIT_S": "2"}
        stack = launch_stack(tmp_path, env={"CLAW_FSYNC": "answer", **flush_every_2_s})
        outcomes, stop = Outcomes(), threading.Event()

        async def load() -> None:
            await asyncio.gather(*(_client(stack, i, outcomes, stop) for i in range(CLIENTS)))

        clients = threading.Thread(target=lambda: asyncio.run(load()), daemon=True)
        clients.start()
        try:
            _wait(lambda: outcomes.answered >= 40, "40 answers before the disk fills")
            ballast = Ballast(spool / f"ballast-{uuid.uuid4().hex}", 32 * 1024, spool=spool)
            with ballast:
                _wait(lambda: len(outcomes.refused) >= 30, "30 calls refused on a nearly full disk")
                answered_while_full = outcomes.answered
            freed_at = outcomes.answered
            _wait(lambda: outcomes.answered >= freed_at + 60, "60 answers once space is freed")
        finally:
            stop.set()
            clients.join(timeout=120)
            stop_group(stack.proxy.process, grace_s=90)  # its last flush commits the spool
            stack.engine.stop()

    turns = stack.rows("turns")
    missing = set(outcomes.turns) - set(turns["turn_id"])
    assert not missing, f"{len(missing)} of {len(outcomes.turns)} answered turns are missing"
    assert not set(outcomes.steps) - set(turns["turn_id"]), "answered steps are missing"
    assert turns["turn_id"].n_unique() == turns.height
    assert answered_while_full > 40, "no call was answered while the disk was full"
    statuses = {(r.status_code, r.headers.get("retry-after")) for r in outcomes.refused}
    others = [r.text[:300] for r in outcomes.refused if r.status_code != 503]
    assert statuses == {(503, "2")}, (statuses, others[:3])
    refused = {r.headers.get("x-litellm-call-id") for r in outcomes.refused} - {None}
    assert not refused & set(turns["turn_id"]), "a turn answered 503 landed"

    log = (tmp_path / "logs" / "proxy.log").read_text(errors="replace")
    episodes = log.count("spool write failed")
    recovered = [int(n) for n in re.findall(r"spool write works again after (\d+) failure", log)]
    assert 1 <= episodes == len(recovered), (episodes, recovered)
    assert sum(recovered) == len(outcomes.refused), ("one failed write per 503", recovered)
    assert "SpoolUnavailable" not in log, "a failed call was logged on its own"
