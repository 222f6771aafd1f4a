"""Refuse an environment holding the compromised litellm releases (1.82.7, 1.82.8)."""

import site
import sys
from importlib.metadata import version
from pathlib import Path

FORBIDDEN = {"1.82.7", "1.82.8"}
installed = version("litellm")
if installed in FORBIDDEN:
    sys.exit(f"litellm {installed} is a known-malicious release; refusing to continue")
for directory in site.getsitepackages():
    if (Path(directory) / "litellm_init.pth").exists():
        sys.exit(f"{directory}/litellm_init.pth exists (1.82.8 payload); refusing to continue")
print(f"litellm {installed}: supply-chain check passed")
