"""The layers import downward only: the library (``claw_pipelines``) imports neither the Dagster
layer (``assets``, ``resources``) nor Dagster, every module of ``assets`` holds Dagster
definitions, and the transforms build on the schemas, the settings and the lake alone. A
stored batch (``batches``: its names, manifest, pins and rows) lies below everything that
plans, exports, trains on or shows batches, so a trainer reading a finished batch never loads
the planner, and no module of those packages imports one that imports it back. The lake
(``lake``) lies below everything that writes tables, has no file circle, and makes every Delta
write of the library. The proxy's packages follow a turn down (edge, capture, then the spool and
the policy gate, then identity and redaction), and only the edge and the command line import
capture or the edge."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BELOW_THE_TRANSFORMS = {
    "claw_pipelines.derived_schemas",
    "claw_pipelines.lake",
    "claw_pipelines.schemas",
    "claw_pipelines.settings",
    "claw_pipelines.turn_prompts",
}

ABOVE_THE_BATCHES = {
    "claw_pipelines.batching",
    "claw_pipelines.exporters",
    "claw_pipelines.trainer",
    "claw_pipelines.inspector",
    "assets",
    "resources",
    "dagster",
}
"""What ``claw_pipelines.batches`` may not import: it is the layer these build on."""

BATCH_PACKAGES = ("batches", "batching", "exporters", "trainer")


def _imported(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (anywhere in it, not only at the top), with
    ``package.name`` for each name a ``from package import name`` takes."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module of the library and the modules of the library it imports."""
    modules = {_module(p): p for p in (REPO / "claw_pipelines").rglob("*.py")}
    return {m: (_imported(p) & modules.keys()) - {m} for m, p in modules.items()}


def _reached(start: str, graph: dict[str, set[str]]) -> set[str]:
    """``start`` and every module its imports reach in ``graph``."""
    reached, frontier = set(), {start}
    while frontier:
        reached |= frontier
        frontier = set().union(*(graph.get(m, set()) for m in frontier)) - reached
    return reached


def _within(name: str, packages: set[str]) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in packages)


def _packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imported(path)}


def test_the_library_imports_neither_the_dagster_layer_nor_dagster() -> None:
    upward = {
        str(path.relative_to(REPO)): sorted(_packages(path) & {"assets", "resources", "dagster"})
        for path in sorted((REPO / "claw_pipelines").rglob("*.py"))
    }
    assert {path: names for path, names in upward.items() if names} == {}


def test_every_module_of_assets_holds_dagster_definitions() -> None:
    modules = sorted(p for p in (REPO / "assets").glob("*.py") if p.name != "__init__.py")
    assert modules
    assert [p.name for p in modules if "dagster" not in _packages(p)] == []


def test_the_transforms_build_on_the_schemas_and_the_lake_alone() -> None:
    for path in (REPO / "claw_pipelines" / "transforms").rglob("*.py"):
        ours = {name for name in _imported(path) if name.split(".")[0] == "claw_pipelines"}
        allowed = BELOW_THE_TRANSFORMS | {"claw_pipelines.transforms"}
        above = {name for name in ours if not _within(name, allowed)}
        assert not above, f"{path.name} imports {sorted(above)}"


def test_the_stored_batch_imports_nothing_that_plans_exports_trains_or_shows() -> None:
    upward = {
        path.name: sorted(n for n in _imported(path) if _within(n, ABOVE_THE_BATCHES))
        for path in sorted((REPO / "claw_pipelines" / "batches").rglob("*.py"))
    }
    assert upward and {name: above for name, above in upward.items() if above} == {}


def test_a_trainer_reads_a_finished_batch_without_loading_the_planner() -> None:
    """``Batch.load`` and ``BatchConsumer`` import only what reads a stored batch."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, claw_pipelines.trainer; print('\\n'.join(sys.modules))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "claw_pipelines.trainer.batch" in loaded
    assert "claw_pipelines.batching.planner" not in loaded
    graph = _import_graph()
    with_packages = {
        m: names | {".".join(n.split(".")[:i]) for n in names for i in range(2, n.count(".") + 1)}
        for m, names in graph.items()
    }  # importing a module runs its packages' __init__ first
    within_functions = _reached("claw_pipelines.trainer", with_packages)  # lazy imports too
    assert "claw_pipelines.batching.planner" not in within_functions


def test_no_module_of_the_batch_packages_imports_one_that_imports_it_back() -> None:
    """No file circle (as ``batch_tables`` and ``exporters/manifest`` once were): the modules
    of ``BATCH_PACKAGES`` reach each other along one direction only."""
    graph = _import_graph()
    ours = [m for m in graph if _within(m, {f"claw_pipelines.{p}" for p in BATCH_PACKAGES})]
    circles = [m for m in ours if any(m in _reached(n, graph) for n in graph[m])]
    assert circles == []


def test_the_library_packages_import_each_other_along_one_direction() -> None:
    """No package circle either (``exporters`` once took the recipe from ``batching``, which
    exports through ``exporters``): the packages of the library, each a concept, form layers."""
    graph = _import_graph()

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        packages.setdefault(package(module), set()).update(package(m) for m in imported)
    for name in packages:
        packages[name].discard(name)
    circles = [p for p in packages if any(p in _reached(q, packages) for q in packages[p])]
    assert circles == []


def _opens_an_increment(path: Path) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "begin"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "Increment"
        for node in ast.walk(ast.parse(path.read_text()))
    )


def test_only_the_incremental_asset_factory_opens_an_increment() -> None:
    """``assets/incremental.py`` names an asset's sources once, as its deps and as what its
    ``Increment`` reads (``tests/dagster/test_incremental_assets.py`` checks the two agree on a
    run): an asset opening its own would read tables its lineage may not show."""
    openers = [p.name for p in sorted((REPO / "assets").glob("*.py")) if _opens_an_increment(p)]
    assert openers == ["incremental.py"]


PROXY_LAYERS = {
    "capture": {"edge"},
    "spool": {"edge", "capture", "policy"},
    "policy": {"edge", "capture", "spool"},
    "identity": {"edge", "capture", "spool", "policy"},
    "redaction": {"edge", "capture", "spool", "policy", "identity", "inspector"},
}
"""A turn's way down, each layer and what it may not import: the HTTP edge (``edge``) wires the
LiteLLM hooks (``capture``) to the spool and the policy gate, which know nothing of where their
rows and calls come from; a turn's identity and the redaction lie below them all."""

PROXY_IMPORTERS = {"capture": {"edge"}, "edge": set()}
"""Besides the command line (``claw proxy`` runs the edge's launcher), who may import the proxy's
own packages: the inspector, the batches and the Dagster layer share its redaction, identity,
spool or policy table without loading LiteLLM's hooks or the edge."""


def _ours(names: set[str]) -> set[str]:
    return {f"claw_pipelines.{name}" for name in names}


def _files(name: str) -> list[Path]:
    """The source files of the library's module or package ``name``."""
    path = REPO / "claw_pipelines" / name
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def test_the_proxy_layers_import_downward_only() -> None:
    upward = {
        str(path.relative_to(REPO)): sorted(n for n in _imported(path) if _within(n, _ours(above)))
        for layer, above in PROXY_LAYERS.items()
        for path in _files(layer)
    }
    assert len(upward) > len(PROXY_LAYERS)
    assert {path: names for path, names in upward.items() if names} == {}


def test_only_the_edge_and_the_command_line_import_capture_or_the_edge() -> None:
    sources = [
        p for top in ("claw_pipelines", "assets", "resources") for p in (REPO / top).rglob("*.py")
    ]
    importers = {
        str(path.relative_to(REPO)): sorted(
            package
            for package, allowed in PROXY_IMPORTERS.items()
            if any(_within(n, _ours({package})) for n in _imported(path))
            and not _within(_module(path), _ours(allowed | {package}))
        )
        for path in sources
        if path != REPO / "claw_pipelines" / "cli.py"
    }
    assert {path: names for path, names in importers.items() if names} == {}


LAKE_BASE = {"claw_pipelines.lake", "claw_pipelines.schemas", "claw_pipelines.settings"}
"""What the lake package builds on. Everything that writes a table imports it, so it imports
nothing else of the library."""


def _deletes_from_a_table(called: ast.expr) -> bool:
    """``table.delete(...)``, ``delta_table.delete(...)`` or ``self.table.delete(...)``."""
    if not (isinstance(called, ast.Attribute) and called.attr == "delete"):
        return False
    receiver = called.value
    named = receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")
    return named in {"table", "delta_table"}


def _writes_delta(path: Path) -> bool:
    """Whether ``path`` imports or calls ``write_deltalake``, calls ``DeltaTable.create`` or
    deletes from a table itself."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and "write_deltalake" in {a.name for a in node.names}:
            return True
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if isinstance(called, ast.Name) and called.id == "write_deltalake":
            return True
        if isinstance(called, ast.Attribute) and called.attr == "write_deltalake":
            return True
        on_delta_table = isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name)
        if on_delta_table and called.value.id == "DeltaTable" and called.attr == "create":
            return True
        if _deletes_from_a_table(called):
            return True
    return False


def test_the_lake_imports_nothing_that_writes_tables() -> None:
    upward = {
        path.name: sorted(
            n
            for n in _imported(path)
            if n.split(".")[0] == "claw_pipelines" and not _within(n, LAKE_BASE)
        )
        for path in sorted((REPO / "claw_pipelines" / "lake").glob("*.py"))
    }
    assert upward and {name: above for name, above in upward.items() if above} == {}


def test_no_module_of_the_lake_imports_one_that_imports_it_back() -> None:
    """No file circle (as ``lake.py`` and ``delta_files.py`` once were)."""
    graph = _import_graph()
    ours = [m for m in graph if _within(m, {"claw_pipelines.lake"})]
    circles = [m for m in ours if any(m in _reached(n, graph) for n in graph[m])]
    assert ours and circles == []


def test_every_delta_write_of_the_library_goes_through_the_lake() -> None:
    """``lake.commits.commit`` owns writer properties, compaction and concurrent runs; a
    ``write_deltalake`` or ``DeltaTable.create`` elsewhere would bypass them."""
    lake = REPO / "claw_pipelines" / "lake"
    assert _writes_delta(lake / "commits.py") and _writes_delta(lake / "tables.py")
    outside = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "claw_pipelines").rglob("*.py"))
        if lake not in path.parents and _writes_delta(path)
    ]
    assert outside == []
