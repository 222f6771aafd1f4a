"""The engine's own record of what it answered (``claw sim --log-file`` / ``CLAW_ENGINE_LOG``).

Tests compare what landed in Delta against this ground truth, so it holds exactly the token IDs
and logprobs the engine sent, one JSON line per answered choice, appended in a single write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from claw_pipelines.engine.responses import Choice


class AnswerLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, response_id: str, choices: Sequence[Choice], stream: bool) -> None:
        lines = "".join(
            json.dumps(
                {
                    "id": response_id,
                    "index": choice.index,
                    "prompt_token_ids": choice.prompt_ids,
                    "token_ids": choice.sample.token_ids,
                    "logprobs": choice.sample.logprobs,
                    "finish_reason": choice.sample.finish_reason,
                    "stream": stream,
                }
            )
            + "\n"
            for choice in choices
        )
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(lines)
