"""Token-ID prompts on ``/v1/completions`` (``prompt: [1, 2, 3]`` or a batch ``[[1, 2], [3]]``),
as OpenAI's and vLLM's text completions take them.

LiteLLM 1.108.7 passes a token-ID prompt through only to an OpenAI text-completion model
(``text-completion-openai/``); a ``hosted_vllm/`` model answers it with a 500 ("Unmapped prompt
format") after retries. So every ``hosted_vllm/`` model gets a twin ``<name>-token-prompts``:
the same server and options as a ``text-completion-openai/`` model, asking for token IDs. The
edge sends a token-ID prompt to its model's twin, where the engine takes the IDs as given and its
turns land engine-exact (the rows name the twin as their ``model``). A prompt of any other shape,
or one for a model without a twin, is refused with a 400 naming the field.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

TOKEN_PROMPT_SUFFIX = "-token-prompts"
VLLM_PREFIX = "hosted_vllm/"
TEXT_COMPLETION_PREFIX = "text-completion-openai/"


class TokenPromptError(ValueError):
    """A token-ID prompt the proxy cannot serve; ``field`` is its path (``prompt[1][0]``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def token_prompt_twin(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The twin of a ``model_list`` entry serving a ``hosted_vllm/`` model, or None."""
    upstream = str((entry.get("litellm_params") or {}).get("model", ""))
    if not upstream.startswith(VLLM_PREFIX):
        return None
    twin = copy.deepcopy(entry)
    twin["model_name"] = f"{entry.get('model_name')}{TOKEN_PROMPT_SUFFIX}"
    twin["litellm_params"]["model"] = TEXT_COMPLETION_PREFIX + upstream.removeprefix(VLLM_PREFIX)
    info = twin.setdefault("model_info", {})
    info["claw"] = {**(info.get("claw") or {}), "return_token_ids": True}
    return twin


def with_token_prompt_twins(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with a twin added for each ``hosted_vllm/`` model that has none (in place)."""
    models = config.setdefault("model_list", [])
    names = {str(entry.get("model_name")) for entry in models}
    twins = [token_prompt_twin(entry) for entry in models]
    models += [t for t in twins if t is not None and t["model_name"] not in names]
    return config


def is_token_prompt(prompt: object) -> bool:
    """Whether ``prompt`` is meant as token IDs: a list whose first item is an int or a list."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], int | list)


def _token_list_problem(ids: object) -> tuple[tuple[int, ...], str] | None:
    if not isinstance(ids, list) or not ids:
        return (), "must be a non-empty list of token IDs"
    for j, token in enumerate(ids):
        if type(token) is not int or token < 0:
            return (j,), "must be a token ID (an integer >= 0)"
    return None


def check_token_prompt(prompt: list[Any]) -> None:
    """Raise ``TokenPromptError`` unless ``prompt`` is a list of token IDs or a list of such
    lists (vLLM's forms), naming the first item that is not."""
    batch = isinstance(prompt[0], list)
    for i, ids in enumerate(prompt if batch else [prompt]):
        problem = _token_list_problem(ids)
        if problem is not None:
            where, what = problem
            path = ([i] if batch else []) + list(where)
            field = "prompt" + "".join(f"[{p}]" for p in path)
            raise TokenPromptError(field, what)


class TokenPrompts:
    """Which served models have a twin, read from the proxy's config (``CONFIG_FILE_PATH``)."""

    def __init__(self, twins: dict[str, str]) -> None:
        self.twins = twins

    @classmethod
    def load(cls, config_path: str | None) -> TokenPrompts:
        if not config_path or not Path(config_path).is_file():
            return cls({})
        config = yaml.safe_load(Path(config_path).read_text()) or {}
        names = {str(entry.get("model_name")) for entry in config.get("model_list") or []}
        return cls({n: n + TOKEN_PROMPT_SUFFIX for n in names if n + TOKEN_PROMPT_SUFFIX in names})

    def routed(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request to send on: a token-ID prompt for a model with a twin goes to the twin;
        anything but a token-ID prompt is returned as it is."""
        if not is_token_prompt(request.get("prompt")):
            return request
        check_token_prompt(request["prompt"])
        model = str(request.get("model", ""))
        twin = model if model in self.twins.values() else self.twins.get(model)
        if twin is None:
            raise TokenPromptError(
                "prompt",
                f"token-ID prompts need a vLLM-protocol (hosted_vllm/) model; {model!r} is not "
                "one: send the prompt as text",
            )
        return {**request, "model": twin}
