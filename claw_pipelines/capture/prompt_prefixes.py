"""What a turn shares with its trajectory's previous call, so its row stores only what is new.

An agent's call is mostly its previous call again: the same tools, the same messages plus the
reply and a tool output, the same token IDs plus a few hundred new ones. Each proxy process
remembers, per trajectory, the last ``KEEP`` calls it spooled (token IDs as int32 bytes, the
request texts), and a new turn of that trajectory stores only what differs from the one it
shares most with, naming it in ``prompt_prefix_turn_id``; ``turn_prompts`` rebuilds the whole
values on read. Every route that lands turns goes through ``land_turns``.

A reference always names a turn this process spooled before the one that names it, which
started no later (readers look for it among the trajectory's earlier turns): what the memory
does not hold (a restart, a call another process served, a trajectory evicted to keep within
``max_bytes``, least recently used first) is stored whole.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from claw_pipelines.schemas import LandingRow, Turn
from claw_pipelines.spool.codec import packed

if TYPE_CHECKING:
    from claw_pipelines.capture.runtime import CaptureRuntime

TEXT_COLUMNS = ("request_messages", "request_tools", "api_request")
"""The request texts stored as a difference from the referenced turn's."""

MIN_SHARED = 64
"""Tokens or characters below which a value is stored whole: a reference that saves less is
not worth a reader's lookup."""

TOKEN_BYTES = 4


@dataclass(frozen=True)
class SpooledCall:
    """A trajectory's last spooled call, as the next one is compared with it."""

    turn_id: str
    started_at: datetime
    sequence: bytes | None
    """Prompt + response token IDs, int32 (None when the engine gave no prompt IDs)."""
    texts: dict[str, str | None]

    @property
    def size(self) -> int:
        texts = sum(len(text) for text in self.texts.values() if text)
        return len(self.sequence or b"") + texts


def spooled_call(turn: Turn) -> SpooledCall:
    """What the next call of ``turn``'s trajectory is compared with (the int32 buffers the
    row's validation made, joined)."""
    sequence = None
    if turn.prompt_token_ids is not None:
        sequence = packed(turn.prompt_token_ids, "i") + packed(turn.response_token_ids or [], "i")
    texts = {name: getattr(turn, name) for name in TEXT_COLUMNS}
    return SpooledCall(turn.turn_id, turn.started_at, sequence, texts)


def common_prefix(a: str | bytes, b: str | bytes, unit: int = 1) -> int:
    """How many ``unit``-sized items ``a`` and ``b`` start with alike. Compares halving
    stretches, each one C-level comparison, so a 200 KB text costs a few copies of it."""
    shorter = min(len(a), len(b)) // unit
    if a[: shorter * unit] == b[: shorter * unit]:
        return shorter
    low, high = 0, shorter  # the first ``low`` items are alike, the first ``high`` are not
    while high - low > 1:
        middle = (low + high) // 2
        if a[low * unit : middle * unit] == b[low * unit : middle * unit]:
            low = middle
        else:
            high = middle
    return low


def common_suffix(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` end with alike (as ``common_prefix``, mirrored)."""
    shorter = min(len(a), len(b))
    if a[len(a) - shorter :] == b[len(b) - shorter :]:
        return shorter
    low, high = 0, shorter
    while high - low > 1:
        middle = (low + high) // 2
        if a[len(a) - middle : len(a) - low] == b[len(b) - middle : len(b) - low]:
            low = middle
        else:
            high = middle
    return low


def _shared_text(previous: str | None, text: str | None) -> tuple[list[int], str] | None:
    """([head, tail], the middle of ``text``) when ``text`` shares enough with ``previous``."""
    if previous is None or text is None:
        return None
    head = common_prefix(previous, text)
    tail = common_suffix(previous[head:], text[head:])
    if head + tail < MIN_SHARED:
        return None
    return [head, tail], text[head : len(text) - tail]


def _shared_tokens(previous: bytes | None, call: SpooledCall, prompt_len: int) -> int | None:
    """How many tokens of ``previous`` (prompt + response IDs) ``call``'s prompt starts with."""
    if previous is None or call.sequence is None:
        return None
    prompt = call.sequence[: prompt_len * TOKEN_BYTES]
    shared = common_prefix(previous, prompt, TOKEN_BYTES)
    return shared if shared >= MIN_SHARED else None


KEEP = 2
"""Calls remembered per trajectory: the last, and the one before it, which the next call
continues when the last was a side call (a summary, a sub-agent's first call)."""


class PromptPrefixes:
    """Per trajectory, the last ``KEEP`` calls this process spooled, within ``max_bytes`` of
    memory (least recently used trajectory forgotten first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._calls: OrderedDict[str, tuple[SpooledCall, ...]] = OrderedDict()
        self._bytes = 0

    def observe(self, turn: Turn) -> SpooledCall | None:
        """What ``turn`` is compared by, and remembered as; None for a turn that is neither (no
        trajectory, or no memory), which then costs nothing."""
        if turn.trajectory_id is None or not self.max_bytes:
            return None
        return spooled_call(turn)

    def compact(
        self,
        turn: Turn,
        call: SpooledCall | None,
        before: dict[str, tuple[SpooledCall, ...]] | None = None,
    ) -> Turn:
        """``turn`` (``call`` is what ``observe`` made of it) as it is stored: what it shares
        with the remembered call of its trajectory (one that started no later; ``before``: the
        calls spooled ahead of it in the same write, by trajectory) it shares most with, left
        out and named. A call that extends the last one whole is not compared further."""
        best: tuple[int, dict[str, Any]] = (0, {})
        trajectory = turn.trajectory_id
        remembered = (
            () if call is None else (before or {}).get(trajectory, self._calls.get(trajectory, ()))
        )
        for previous in reversed(remembered):
            if previous.started_at <= turn.started_at:
                best = max(best, _shared(previous, turn, call), key=lambda found: found[0])
                if best[1].get("prompt_prefix_len") == len(previous.sequence or b"") // TOKEN_BYTES:
                    break
        update = {"prompt_len": _length(turn.prompt_token_ids), **best[1]}
        if best[0] and trajectory in self._calls:
            self._calls.move_to_end(trajectory)
        return turn.model_copy(update=update)

    async def land(self, runtime: CaptureRuntime, rows: list[LandingRow]) -> None:
        """Spool ``rows`` with each turn as stored (a turn may refer to one ahead of it in
        ``rows``: it is spooled first), then remember the turns whole: only once they are
        spooled, so a reference never names a turn that is not."""
        stored, spooled, before = [], [], {}
        for row in rows:
            if isinstance(row, Turn):
                turn, call = row, self.observe(row)
                row = self.compact(turn, call, before)
                spooled.append((turn, call))
                if call is not None and turn.status == "success":
                    kept = before.get(turn.trajectory_id, self._calls.get(turn.trajectory_id, ()))
                    before[turn.trajectory_id] = (*kept, call)[-KEEP:]
            stored.append(row)
        await runtime.land_durably(stored)
        for turn, call in spooled:
            self.remember(turn, call)

    def remember(self, turn: Turn, call: SpooledCall | None) -> None:
        """``turn`` (whole, as the engine answered it; ``call`` what ``observe`` made of it) was
        spooled: the next calls of its trajectory are compared with it. A failed call is not:
        the agent retries what it sent."""
        if call is None or turn.status != "success" or call.size > self.max_bytes:
            return
        kept = (*self._calls.get(turn.trajectory_id, ()), call)[-KEEP:]
        self._forget(turn.trajectory_id)
        self._calls[turn.trajectory_id] = kept
        self._bytes += sum(c.size for c in kept)
        while self._bytes > self.max_bytes:
            self._forget(next(iter(self._calls)))

    def _forget(self, trajectory_id: str) -> None:
        calls = self._calls.pop(trajectory_id, ())
        self._bytes -= sum(call.size for call in calls)


@cache
def _process_prefixes(max_bytes: int) -> PromptPrefixes:
    return PromptPrefixes(max_bytes)


async def land_turns(runtime: CaptureRuntime, rows: list[LandingRow]) -> None:
    """Spool ``rows`` through this process's memory of calls (``CLAW_PROMPT_CACHE_MB``), one for
    every route that lands turns (model calls, white-box steps), so each compares with the
    calls the others spooled."""
    await _process_prefixes(runtime.settings.prompt_cache_mb * 2**20).land(runtime, rows)


def _shared(previous: SpooledCall, turn: Turn, call: SpooledCall) -> tuple[int, dict[str, Any]]:
    """(bytes saved, the columns ``turn`` stores) when stored against ``previous``."""
    saved, update = 0, {}
    shared = _shared_tokens(previous.sequence, call, len(turn.prompt_token_ids or ()))
    if shared is not None:
        saved += shared * TOKEN_BYTES
        update |= {"prompt_prefix_len": shared, "prompt_token_ids": turn.prompt_token_ids[shared:]}
    for name in TEXT_COLUMNS:
        text = _shared_text(previous.texts[name], call.texts[name])
        if text is not None:
            saved += sum(text[0])
            update |= {f"{name}_shared": text[0], name: text[1]}
    if update:
        update["prompt_prefix_turn_id"] = previous.turn_id
    return saved, update


def _length(values: list[int] | None) -> int | None:
    return None if values is None else len(values)
