"""The stack the docs blocks run against, as the blocks see it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from claw_pipelines.processes import Service

DEFAULT_PORTS = {"proxy": 4000, "dagster": 3000, "inspector": 8120, "engine": 8001}
"""``make up``'s ports, which the pages name and the test moves to free ones."""

LINKED = (".venv", "assets", "resources", "bench", "workspace.yaml", "dagster.yaml")
"""What of the repository the blocks use by relative path (read only)."""


@dataclass
class DocsStack:
    folder: Path
    ports: dict[str, int]
    up: Service

    def localize(self, code: str) -> str:
        """``code`` with ``make up``'s addresses pointed at this stack's ports."""
        moved = {str(port): str(self.ports[name]) for name, port in DEFAULT_PORTS.items()}
        return re.sub(
            r"127\.0\.0\.1:(\d+)\b",
            lambda m: f"127.0.0.1:{moved.get(m.group(1), m.group(1))}",
            code,
        )

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.folder / '.venv' / 'bin'}:/usr/bin:/bin",
            "HOME": str(self.folder),
            "CLAW_PROXY_URL": f"http://127.0.0.1:{self.ports['proxy']}",
            "CLAW_DAGSTER_URL": f"http://127.0.0.1:{self.ports['dagster']}",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LANG": "C.UTF-8",
        }
