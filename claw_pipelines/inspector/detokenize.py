"""Token text by the tokenizer of the model that produced the IDs.

Token IDs mean something only in their model's vocabulary. The embedded engine's turns are
decoded with its own tokenizer (in process); any other model's with its backend's
``/detokenize`` route, which vLLM and the embedded engine serve (``{"model", "tokens"}`` ->
``{"prompt"}``), or with the server the operator names for that model in ``CLAW_TOKENIZERS``
(JSON ``{"<model>": "http://host:port"}``), e.g. when the inspector reaches the backend by
another address. A model with neither shows raw IDs. Texts are cached per (server, model, id).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import httpx
import polars as pl

from claw_pipelines.engine import tokenizer
from claw_pipelines.engine.server import MODEL_NAME as EMBEDDED_MODEL

TOKENIZERS_ENV = "CLAW_TOKENIZERS"
TIMEOUT_S = 5.0
PARALLEL_REQUESTS = 8

_texts: dict[tuple[str, str, int], str] = {}


@cache
def embedded_vocabulary() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": pl.Series(range(tokenizer.VOCAB_SIZE), dtype=pl.Int32),
            "text": [tokenizer.token_str(i) for i in range(tokenizer.VOCAB_SIZE)],
        }
    )


def named_tokenizers() -> dict[str, str]:
    """``CLAW_TOKENIZERS``: model -> base URL of a server with ``/detokenize``."""
    raw = os.environ.get(TOKENIZERS_ENV, "").strip()
    return json.loads(raw) if raw else {}


def detokenize_url(model: str | None, backend: str | None) -> str | None:
    """Where ``model``'s IDs are decoded: the operator's server for it, else its backend's
    (``backend`` = ``<provider>:<api_base>``, vLLM serving ``/detokenize`` beside ``/v1``)."""
    named = named_tokenizers().get(model or "")
    if named:
        return f"{named.rstrip('/')}/detokenize"
    base = (backend or "").partition(":")[2]
    if not base.startswith(("http://", "https://")):
        return None
    return f"{base.rstrip('/').removesuffix('/v1')}/detokenize"


def _fetch(client: httpx.Client, url: str, model: str, token_id: int) -> str | None:
    try:
        response = client.post(url, json={"model": model, "tokens": [token_id]})
        response.raise_for_status()
        return response.json()["prompt"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def _remote_texts(url: str, model: str, ids: list[int]) -> pl.DataFrame | None:
    missing = [i for i in ids if (url, model, i) not in _texts]
    if missing:
        with (
            httpx.Client(timeout=TIMEOUT_S) as client,
            ThreadPoolExecutor(PARALLEL_REQUESTS) as pool,
        ):
            texts = list(pool.map(lambda i: _fetch(client, url, model, i), missing))
        if any(text is None for text in texts):
            return None  # unreachable or refused: raw IDs rather than half a decoding
        _texts.update({(url, model, i): t for i, t in zip(missing, texts, strict=True)})
    return pl.DataFrame(
        {"id": pl.Series(ids, dtype=pl.Int32), "text": [_texts[(url, model, i)] for i in ids]}
    )


def token_texts(model: str | None, backend: str | None, ids: list[int]) -> pl.DataFrame | None:
    """(id, text) for ``ids`` in ``model``'s vocabulary; None when no tokenizer is known."""
    if model == EMBEDDED_MODEL:
        return embedded_vocabulary().filter(pl.col("id").is_in(ids))
    url = detokenize_url(model, backend)
    return None if url is None else _remote_texts(url, model or "", sorted(set(ids)))
