"""The inspector's web server: FastAPI + Jinja2 pages with a little vanilla JavaScript.

Why this stack: curators need a few dense, linkable pages (lists, one trajectory, a group, a
batch plan) more than a rich client. Server-rendered HTML needs no build step and no CDN (this
machine has no internet beyond package registries), every page is a URL that can be shared, Jinja
autoescaping covers all user content, and the same FastAPI app serves the JSON endpoints that the
page's small script polls for live figures and that the benchmark times. Data apps like Streamlit
re-run a script per interaction and hold state per session; here one in-memory index, refreshed
from the Delta change feeds in a background thread, serves every request.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import anyio
import jinja2
import polars as pl
import uvicorn
from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.middleware.trustedhost import TrustedHostMiddleware
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from claw_pipelines.access import is_loopback, key_refusal
from claw_pipelines.batches.recipe import Recipe, load_recipes
from claw_pipelines.config_files import config_file
from claw_pipelines.inspector import render
from claw_pipelines.inspector.api_models import (
    BatchPreviewOut,
    DroppedReason,
    FullPrompt,
    GroupOut,
    GroupPlan,
    PromptTokens,
    TrajectoryDetail,
    TrajectoryList,
    TrajectoryRow,
)
from claw_pipelines.inspector.auth import KeyRequired, SameOriginWrites
from claw_pipelines.inspector.batch_preview import (
    Preview,
    PreviewCache,
    dagster_asset_url,
)
from claw_pipelines.inspector.curation import (
    LabelRequest,
    LabelResult,
    UnknownTargets,
    write_labels,
)
from claw_pipelines.inspector.filters import facets, listing
from claw_pipelines.inspector.overview import Overview, RecipeStatus, compute, recipe_counts
from claw_pipelines.inspector.tables import LakeIndex
from claw_pipelines.inspector.trajectory import full_prompt, prompt_tokens, trajectory_detail
from claw_pipelines.lake import Lake
from claw_pipelines.lake.store import LakeStoreError
from claw_pipelines.redaction import Redactor
from claw_pipelines.settings import get_settings

Found = TypeVar("Found")
REFRESH_S = 1.0
"""How often the background thread looks for new Delta versions."""
IDLE_AFTER_S = 60.0
"""The background refresh pauses once no request came for this long, and the first request after
brings the index up to date before it is served: under steady traffic a refresh reads every
table's new versions and re-plans each recipe's next batch every second, a fifth of a core that
nobody looked at (``bench/soak.py``)."""


class Inspector:
    """The lake index, the recipes and their cached batch plans, refreshed in the background."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        try:
            self.recipes: dict[str, Recipe] = load_recipes(config_file("batches.yaml"))
            self.recipes_error: str | None = None
        except Exception as error:  # a broken batches.yaml must not take the inspector down
            self.recipes, self.recipes_error = {}, f"cannot load batches.yaml: {error}"
        self.index = LakeIndex(lake, list(self.recipes))
        self.previews = PreviewCache(lake)
        self.preview_errors: dict[str, str] = {}
        self.refresh_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refreshing = threading.Lock()
        self._used_at = time.monotonic()

    def refresh(self) -> None:
        with self._refreshing:
            self._refresh()

    def _refresh(self) -> None:
        try:
            state = self.index.refresh()
            self.refresh_error = None
        except Exception as error:  # keep serving the last good state, and say why it is stale
            self.refresh_error = f"{type(error).__name__}: {error}"
            return
        for name, recipe in self.recipes.items():
            try:
                self.previews.get(state, recipe)
                self.preview_errors.pop(name, None)
            except Exception as error:  # shown on the batch page instead of a plan
                self.preview_errors[name] = f"{type(error).__name__}: {error}"

    def in_use(self) -> None:
        """A request came: the background refresh goes on, and an index it left idle is
        brought up to date first."""
        idle = self._idle()
        self._used_at = time.monotonic()
        if idle and self._thread is not None:
            self.refresh()

    def _idle(self) -> bool:
        return time.monotonic() - self._used_at > IDLE_AFTER_S

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if not self._idle():
                self.refresh()
            self._stop.wait(max(0.05, REFRESH_S - (time.monotonic() - started)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="inspector-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def overview(self) -> Overview:
        state = self.index.state
        statuses = []
        for name in self.recipes:
            counts = recipe_counts(state, name)
            cached = self.previews.cached(name)
            plan = cached.plan if cached else None
            statuses.append(
                RecipeStatus(
                    recipe=name,
                    ready_groups=None if plan is None else plan.planned["group_id"].n_unique(),
                    batch_ready=None if plan is None else plan.ready,
                    batches_produced=counts.batches,
                    steps_in_batches=counts.steps_in_batches,
                    steps_consumed=counts.steps_consumed,
                    dagster_url=dagster_asset_url(name),
                    plan_error=self.preview_errors.get(name),
                )
            )
        return compute(state, datetime.now(UTC), statuses)


def preview_out(preview: Preview) -> BatchPreviewOut:
    recipe = preview.recipe
    plan = preview.plan
    return BatchPreviewOut(
        recipe=recipe.name,
        algorithm=recipe.algorithm,
        group_size=recipe.group_size,
        groups_per_batch=recipe.groups_per_batch,
        dagster_url=preview.dagster_url,
        ready=None if plan is None else plan.ready,
        batch_id=None if plan is None else plan.batch_id,
        rows=0 if plan is None else plan.planned.height,
        groups=[GroupPlan(**g) for g in preview.groups.to_dicts()],
        dropped=[DroppedReason(**d) for d in preview.dropped.to_dicts()],
        why_empty=preview.why_empty,
        planned_at=preview.planned_at,
    )


def create_app(
    lake: Lake | None = None,
    *,
    background: bool = True,
    allowed_hosts: list[str] | None = None,
    key: str | None = None,
) -> FastAPI:
    """The app over ``lake`` (default: CLAW_LAKE_URI). ``background=False`` leaves refreshing
    to the caller (tests call ``app.state.inspector.refresh()``); ``allowed_hosts`` restricts
    the Host header (a loopback server refuses other names, against DNS rebinding); ``key``,
    if given, is required by every request (``auth``)."""
    redactor = Redactor.from_environment()
    redactor.add_secret(key)
    app = FastAPI(title="claw inspector", lifespan=_lifespan, docs_url="/api/docs", redoc_url=None)
    app.state.inspector = Inspector(lake or Lake.from_settings())
    app.state.background = background
    app.state.redactor = redactor
    app.state.templates = _templates()
    if allowed_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    if key:
        app.add_middleware(KeyRequired, key=key)
    app.mount("/static", StaticFiles(packages=[(__package__, "static")]), name="static")
    app.add_middleware(SameOriginWrites)
    app.add_middleware(MarksUse)
    _add_routes(app)
    # Starlette's HTTPException: routing raises it for unknown URLs, and FastAPI's subclasses it.
    app.add_exception_handler(StarletteHTTPException, _html_errors)
    return app


class MarksUse:
    """ASGI middleware telling the app's ``Inspector`` of each request (``Inspector.in_use``)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await anyio.to_thread.run_sync(scope["app"].state.inspector.in_use)
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    inspector: Inspector = app.state.inspector
    inspector.refresh()
    if app.state.background:
        inspector.start()
    yield
    inspector.stop()


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["token_colour"] = render.token_colour
    env.filters["url_segment"] = render.url_segment
    env.filters["token_spans"] = render.token_spans
    env.tests["long_text"] = render.is_long_text
    return Jinja2Templates(env=env)


def _inspector(request: Request) -> Inspector:
    return request.app.state.inspector


Current = Annotated[Inspector, Depends(_inspector)]
"""A route's ``Inspector``: the app's one index of the lake."""


def _page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    inspector = _inspector(request)
    return request.app.state.templates.TemplateResponse(
        request,
        name,
        {
            "lake_root": inspector.lake.root,
            "refreshed_at": inspector.index.state.refreshed_at,
            "refresh_error": inspector.refresh_error,
            "recipes": list(inspector.recipes),
            **context,
        },
        status_code=status_code,
    )


def _found(value: Found | None, missing: str) -> Found:
    """``value``, or a 404 saying what is ``missing``."""
    if value is None:
        raise HTTPException(404, missing)
    return value


def _detail_or_404(inspector: Inspector, trajectory_id: str) -> TrajectoryDetail:
    detail = trajectory_detail(inspector.lake, inspector.index.state, trajectory_id)
    return _found(detail, f"no trajectory {trajectory_id!r} in the turns table")


def _group_or_404(inspector: Inspector, group_id: str) -> GroupOut:
    summary = inspector.index.state.summary
    members = summary.filter(pl.col("group_id") == group_id).sort("started_at")
    if members.is_empty():
        raise HTTPException(404, f"no group {group_id!r} in the turns table")
    rewards = members["reward"].drop_nulls()
    return GroupOut(
        group_id=group_id,
        rollouts=[_detail_or_404(inspector, t) for t in members["trajectory_id"]],
        reward_mean=rewards.mean() if rewards.len() else None,  # type: ignore[arg-type]
        reward_std=rewards.std(ddof=0) if rewards.len() else None,  # type: ignore[arg-type]
    )


def _preview_or_404(inspector: Inspector, recipe: str) -> BatchPreviewOut:
    if recipe not in inspector.recipes:
        raise HTTPException(404, f"no recipe {recipe!r} in batches.yaml")
    try:
        return preview_out(inspector.previews.get(inspector.index.state, inspector.recipes[recipe]))
    except Exception as error:  # the planner's failure is shown, not hidden behind a 500
        raise HTTPException(
            503, f"planning {recipe} failed: {type(error).__name__}: {error}"
        ) from error


def health(inspector: Current) -> dict[str, Any]:
    return {"ok": True, "versions": inspector.index.state.versions}


def overview_json(inspector: Current) -> Overview:
    return inspector.overview()


def trajectories_json(request: Request, inspector: Current) -> TrajectoryList:
    found = listing(request.query_params, inspector.index.state.summary)
    return TrajectoryList(
        total=inspector.index.state.summary.height,
        matched=found.matched,
        page=found.page.page,
        size=found.page.size,
        rows=[TrajectoryRow(**r) for r in found.rows.drop("search_text").to_dicts()],
    )


def trajectory_summary_json(trajectory_id: str, inspector: Current) -> TrajectoryRow:
    rows = inspector.index.state.summary.filter(pl.col("trajectory_id") == trajectory_id)
    if rows.is_empty():
        raise HTTPException(404, f"no trajectory {trajectory_id!r}")
    return TrajectoryRow(**rows.drop("search_text").row(0, named=True))


def trajectory_json(trajectory_id: str, inspector: Current) -> TrajectoryDetail:
    return _detail_or_404(inspector, trajectory_id)


def prompt_tokens_json(turn_id: str, inspector: Current) -> PromptTokens:
    tokens = prompt_tokens(inspector.lake, inspector.index.state, turn_id)
    return _found(tokens, f"no turn {turn_id!r}")


def full_prompt_json(turn_id: str, inspector: Current) -> FullPrompt:
    prompt = full_prompt(inspector.lake, inspector.index.state, turn_id)
    return _found(prompt, f"no turn {turn_id!r}")


def group_json(group_id: str, inspector: Current) -> GroupOut:
    return _group_or_404(inspector, group_id)


def labels_json(
    labels: Annotated[LabelRequest, Body()], request: Request, inspector: Current
) -> LabelResult:
    try:
        result = write_labels(
            inspector.lake, labels, inspector.index.state, request.app.state.redactor
        )
    except UnknownTargets as error:
        raise HTTPException(404, str(error)) from error
    inspector.refresh()
    return result


def batch_json(recipe: str, inspector: Current) -> BatchPreviewOut:
    return _preview_or_404(inspector, recipe)


def overview_page(request: Request, inspector: Current) -> HTMLResponse:
    return _page(request, "overview.html", overview=inspector.overview())


def trajectories_page(request: Request, inspector: Current) -> HTMLResponse:
    f, p, rows, matched = listing(request.query_params, inspector.index.state.summary)
    state = inspector.index.state
    return _page(
        request,
        "trajectories.html",
        filter=f,
        page_info=p,
        rows=rows.to_dicts(),
        matched=matched,
        total=state.summary.height,
        facets=facets(state.summary),
        prev_url=str(request.url.include_query_params(page=p.page - 1)) if p.page > 1 else None,
        next_url=(
            str(request.url.include_query_params(page=p.page + 1))
            if p.page * p.size < matched
            else None
        ),
        turns_missing=not state.has("turns"),
    )


def trajectory_page(request: Request, trajectory_id: str, inspector: Current) -> HTMLResponse:
    return _page(request, "trajectory.html", detail=_detail_or_404(inspector, trajectory_id))


def prompt_page(request: Request, turn_id: str, inspector: Current) -> HTMLResponse:
    return _page(request, "prompt.html", prompt=full_prompt_json(turn_id, inspector))


def group_page(request: Request, group_id: str, inspector: Current) -> HTMLResponse:
    return _page(request, "group.html", group=_group_or_404(inspector, group_id))


def batches_page(request: Request, inspector: Current) -> HTMLResponse:
    first = next(iter(inspector.recipes), None)
    if first is None:
        error = inspector.recipes_error or "batches.yaml declares no recipes"
        return _page(request, "batch.html", preview=None, error=error)
    return batch_page(request, first, inspector)


def batch_page(request: Request, recipe: str, inspector: Current) -> HTMLResponse:
    try:
        preview = _preview_or_404(inspector, recipe)
    except HTTPException as error:
        return _page(request, "batch.html", error.status_code, preview=None, error=error.detail)
    return _page(request, "batch.html", preview=preview, error=None)


def _add_routes(app: FastAPI) -> None:
    """The JSON endpoints (``/api``) and the pages, in match order: ids may contain "/", hence
    the ``:path`` converters, and a suffix route comes before the route it extends, or the id
    would swallow the suffix."""
    app.add_api_route("/api/health", health)
    app.add_api_route("/api/overview", overview_json)
    app.add_api_route("/api/trajectories", trajectories_json)
    app.add_api_route("/api/trajectories/{trajectory_id:path}/summary", trajectory_summary_json)
    app.add_api_route("/api/trajectories/{trajectory_id:path}", trajectory_json)
    app.add_api_route("/api/steps/{turn_id}/prompt_tokens", prompt_tokens_json)
    app.add_api_route("/api/steps/{turn_id}/prompt", full_prompt_json)
    app.add_api_route("/api/groups/{group_id:path}", group_json)
    app.add_api_route("/api/labels", labels_json, methods=["POST"])
    app.add_api_route("/api/batches/{recipe}", batch_json)
    app.add_api_route("/", overview_page, response_class=HTMLResponse)
    app.add_api_route("/trajectories", trajectories_page, response_class=HTMLResponse)
    app.add_api_route(
        "/trajectories/{trajectory_id:path}", trajectory_page, response_class=HTMLResponse
    )
    app.add_api_route("/steps/{turn_id}/prompt", prompt_page, response_class=HTMLResponse)
    app.add_api_route("/groups/{group_id:path}", group_page, response_class=HTMLResponse)
    app.add_api_route("/batches", batches_page, response_class=HTMLResponse)
    app.add_api_route("/batches/{recipe}", batch_page, response_class=HTMLResponse)


async def _html_errors(request: Request, error: StarletteHTTPException) -> Any:
    """Errors as a page, except under /api (JSON, as FastAPI answers them)."""
    if request.url.path.startswith("/api/"):
        return await http_exception_handler(request, error)
    return _page(request, "error.html", error.status_code, error=error.detail)


LOOPBACK_NAMES = ["127.0.0.1", "localhost", "::1"]


def serve(host: str = "127.0.0.1", port: int = 8120) -> None:
    """Run the inspector over CLAW_LAKE_URI until interrupted; off loopback only with a strong
    ``CLAW_INSPECTOR_KEY``, as the proxy needs a strong master key. A lake it could not write
    labels to is refused at start, with one line."""
    key = get_settings().inspector_key
    refusal = key_refusal(host, key, "CLAW_INSPECTOR_KEY")
    if refusal is not None:
        raise SystemExit(f"claw inspect: {refusal}")
    try:
        lake = Lake.checked()
    except LakeStoreError as error:
        raise SystemExit(f"claw inspect: {error}") from error
    app = create_app(lake, allowed_hosts=LOOPBACK_NAMES if is_loopback(host) else None, key=key)
    uvicorn.run(app, host=host, port=port, log_level="warning")
