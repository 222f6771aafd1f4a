"""The capture state of one proxy process: spool writer, flusher, redactor and per-model options.

Each proxy worker process imports the callback separately, so each gets its own runtime (and its
own spool directory); ``CaptureRuntime.current()`` creates it on first use and starts the flusher,
which first replays whatever stopped processes left in the spool.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import yaml
from litellm.router_utils.common_utils import resolve_model_group_alias
from pydantic import BaseModel, ConfigDict

from claw_pipelines.capture.turns import PendingCall
from claw_pipelines.lake import Lake
from claw_pipelines.maintenance import Maintainer, Retention
from claw_pipelines.policy.gate import ServedPolicy
from claw_pipelines.redaction import Redactor, ScrubbedLogs
from claw_pipelines.schemas import LandingRow
from claw_pipelines.settings import ClawSettings, get_settings
from claw_pipelines.spool.flusher import SpoolFlusher
from claw_pipelines.spool.staging import Committer, Stager
from claw_pipelines.spool.writer import SpoolErrorsLoggedOnce, SpoolWriter

TOKEN_RETURNING_PREFIXES = ("hosted_vllm/",)
MAX_PENDING_CALLS = 100_000


class ModelCapture(BaseModel):
    """Per-model capture options (``model_info.claw`` in litellm.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    return_token_ids: bool = False
    logprobs: bool = False
    top_logprobs: int | None = None
    stream_mode: Literal["buffered", "passthrough"] = "passthrough"
    api_mode: Literal["bridge", "native"] = "native"
    """How Responses and Messages calls are served: ``bridge`` through the engine's chat
    completions call (exact token IDs), ``native`` by LiteLLM's own route for them."""


NO_OPTIONS = ModelCapture()
"""A model the config does not name (looked up twice per call: not built anew each time)."""


def model_capture_options(config_path: str | None) -> dict[str, ModelCapture]:
    """Options by served model name (an alias in ``router_settings.model_group_alias`` has its
    target's); token-returning backends (hosted_vllm/) default to exact mode.

    ``buffered`` streams are served from a non-streaming upstream call and re-streamed to the
    client, because LiteLLM drops ``prompt_token_ids`` from streamed responses; ``bridge``
    serves Responses and Messages calls through chat, because vLLM's own routes for them return
    no token IDs.
    """
    if not config_path or not Path(config_path).is_file():
        return {}
    config = yaml.safe_load(Path(config_path).read_text()) or {}
    options: dict[str, ModelCapture] = {}
    for entry in config.get("model_list") or []:
        upstream = str((entry.get("litellm_params") or {}).get("model", ""))
        declared = ((entry.get("model_info") or {}).get("claw")) or {}
        defaults = {}
        if upstream.startswith(TOKEN_RETURNING_PREFIXES):
            defaults = {
                "return_token_ids": True,
                "logprobs": True,
                "stream_mode": "buffered",
                "api_mode": "bridge",
            }
        options[str(entry["model_name"])] = ModelCapture.model_validate(defaults | declared)
    aliases = (config.get("router_settings") or {}).get("model_group_alias") or {}
    for alias in aliases:
        target = resolve_model_group_alias(aliases, alias)
        if target in options:
            options.setdefault(str(alias), options[target])
    return options


class CaptureRuntime:
    """Everything one process needs to land rows durably."""

    _instance: CaptureRuntime | None = None
    _instance_lock = threading.Lock()

    def __init__(self, settings: ClawSettings) -> None:
        self.settings = settings
        self.lake = Lake.from_settings(settings)
        self.redactor = Redactor.from_environment()
        self.models = model_capture_options(os.environ.get("CONFIG_FILE_PATH"))
        self.writer = SpoolWriter(
            settings.spool_dir.absolute(), fsync_per_answer=settings.fsync == "answer"
        )
        self.committer = (
            Committer(self.lake, self.writer.writer_id, settings.commit_window_s or 1.0)
            if settings.commit_mode == "staged"
            else None
        )
        self.flusher = SpoolFlusher(
            self.writer,
            self.lake,
            max_rows=settings.flush_max_rows,
            interval_s=settings.flush_interval_s,
            max_wait_s=settings.flush_max_wait_s,
            window_s=settings.commit_window_s,
            stager=None if self.committer is None else Stager(self.committer.area),
            fsync_interval_s=settings.fsync_interval_ms / 1000
            if settings.fsync == "interval"
            else None,
        )
        self.pending: OrderedDict[str, PendingCall] = OrderedDict()
        logging.getLogger("LiteLLM Proxy").addFilter(SpoolErrorsLoggedOnce())
        ScrubbedLogs(self.redactor).install()
        self.flusher.start()
        if self.committer is not None:
            self.committer.start()
        self.policy = ServedPolicy(self.lake, self.writer.writer_id, settings.pause_max_hold_s)
        self.policy.start()
        self.maintainer = Maintainer(
            self.lake,
            Retention.from_settings(settings),
            self.writer.writer_id,
            settings.maintenance_interval_s,
        )
        if settings.maintenance_interval_s > 0:
            self.maintainer.start()

    @classmethod
    def current(cls) -> CaptureRuntime:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls(get_settings())
            return cls._instance

    @classmethod
    def shutdown_current(cls) -> None:
        """Commit everything spooled (graceful stop); what cannot be committed stays spooled."""
        with cls._instance_lock:
            if cls._instance is not None:
                cls._instance.policy.stop()
                cls._instance.maintainer.stop()
                cls._instance.flusher.stop()
                if cls._instance.committer is not None:
                    cls._instance.committer.stop()
                cls._instance.writer.close()
                cls._instance = None

    def options_for(self, model_name: str) -> ModelCapture:
        return self.models.get(model_name, NO_OPTIONS)

    def remember(self, pending: PendingCall) -> None:
        self.pending[pending.call_id] = pending
        while len(self.pending) > MAX_PENDING_CALLS:
            self.pending.popitem(last=False)

    def land(self, rows: list[LandingRow]) -> None:
        """Append rows to the spool (synchronous write: durable against a process crash); a row
        that closes something (a completion, a reward) has the flusher commit in the commit
        window's next flush."""
        for row in rows:
            self.writer.append(row)
        self.flusher.nudge(urgent=any(row.closes for row in rows))

    async def land_durably(self, rows: list[LandingRow]) -> None:
        """Append rows and, with per-answer fsync, wait for the group commit."""
        self.land(rows)
        await self.writer.durable()
