"""The layers import downward only: the library (``claw_pipelines``) imports neither the Dagster
layer (``assets``, ``resources``) nor Dagster, every module of ``assets`` holds Dagster
definitions, and the transforms build on the schemas, the settings and the lake alone."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BELOW_THE_TRANSFORMS = {
    "claw_pipelines.derived_schemas",
    "claw_pipelines.lake",
    "claw_pipelines.schemas",
    "claw_pipelines.settings",
}


def _imported(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (anywhere in it, not only at the top)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


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
        above = {
            name
            for name in ours - BELOW_THE_TRANSFORMS
            if not name.startswith("claw_pipelines.transforms")
        }
        assert not above, f"{path.name} imports {sorted(above)}"
