"""The capture stack in front of the fake backend (``fake_backend.py``), as the
``fake_backend_stack`` fixture (conftest.py) yields it."""

from __future__ import annotations

from dataclasses import dataclass

from stack_fixtures import CaptureStack


@dataclass
class FakeBackendStack(CaptureStack):
    backend_key: str = ""
    """The API key the proxy sends the fake backend (``litellm_params.api_key``)."""
