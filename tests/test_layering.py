"""The arrows of the house picture hold: an AST scan of every module of pipelines/, sim/, models/ and assets/.

`assets` -> `pipelines`, `sim`, `models`; `models` -> `sim`; nothing below `assets` imports dagster; `sim` names no
`models` module, not even as an import string; `pipelines` names neither `sim` nor `models`; nothing but tests (and
the `cli` entry point) imports `assets`. A module is "named" by an import (relative ones resolved) or by a string
constant that is a module path, such as "models.dejavu" or "models.dejavu:DejavuPolicy" (what importlib gets).

Also the shape of `assets/` (issue 18): every top-level function there is a Dagster adapter, and the package
stays small.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "sim", "models", "assets")
MODULE_PATH = re.compile(r"(?P<top>[A-Za-z_]\w*)(\.[A-Za-z_]\w*)*(:[A-Za-z_][\w.]*)?")
"""A string constant that is a module path, optionally with ':attr' (only strings naming a project package or
dagster, with a dot or a colon, count: prose that mentions a module is documentation, not a dependency)."""


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _absolute(path: Path, node: ast.ImportFrom, root: Path) -> str:
    """The module an ImportFrom reads from, relative imports resolved against the file's package."""
    if not node.level:
        return node.module or ""
    package = list(path.relative_to(root).with_suffix("").parts)
    package = package[
        : len(package) - node.level
    ]  # a module's package is its parent; each extra dot one more
    return ".".join(package + ([node.module] if node.module else []))


@cache
def named(path: Path, root: Path = ROOT) -> tuple[tuple[int, str, str], ...]:
    """(line, module, how) for every module the file names: `import`, `from` or `string`."""
    out = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node, root)
            out += [(node.lineno, f"{base}.{a.name}" if base else a.name, "from") for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            match = MODULE_PATH.fullmatch(text)
            if match and ("." in text or ":" in text) and match["top"] in (*PACKAGES, "cli", "dagster"):
                out.append((node.lineno, text.split(":")[0], "string"))
    return tuple(out)


def naming(path: Path, *tops: str) -> list[str]:
    """'file:line: how module' for each module of the top-level packages `tops` the file names."""
    return [
        f"{rel(path)}:{line}: {how} {module}"
        for line, module, how in named(path)
        if module.split(".")[0].split("_")[0] in tops or module.split(".")[0] in tops
    ]


def files_of(*packages: str, xfail: dict[str, str] | None = None) -> list:
    return [
        pytest.param(p, id=rel(p), marks=pytest.mark.xfail(strict=False, reason=(xfail or {})[rel(p)]))
        if rel(p) in (xfail or {})
        else pytest.param(p, id=rel(p))
        for package in packages
        for p in modules(package)
    ]


# ---------------------------------------------------------------- imports


def test_the_scan_sees_every_package_and_finds_what_it_looks_for(tmp_path):
    for package in PACKAGES:
        assert modules(package), package
    probe = tmp_path / "sim" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import dagster as dg\nfrom ..models import dejavu\nfrom . import state\n"
        'X = "models.dejavu:Dejavu"\nY = "see models.dejavu"\n'
    )
    found = {(m, how) for _, m, how in named(probe, tmp_path)}
    assert found == {
        ("dagster", "import"),
        ("models.dejavu", "from"),
        ("sim.state", "from"),
        ("models.dejavu", "string"),
    }


@pytest.mark.parametrize("path", files_of("pipelines", "sim", "models"))
def test_nothing_below_assets_imports_dagster(path):
    assert [n for n in naming(path, "dagster") if "string" not in n] == []


@pytest.mark.parametrize(
    "path",
    files_of("sim"),
)
def test_sim_names_no_models_module(path):
    assert naming(path, "models") == []


@pytest.mark.parametrize("path", files_of("pipelines"))
def test_pipelines_name_neither_sim_nor_models(path):
    assert naming(path, "sim", "models") == []


@pytest.mark.parametrize("path", files_of("pipelines", "sim", "models"))
def test_nothing_but_tests_and_the_cli_imports_assets(path):
    assert naming(path, "assets", "cli") == []


# ---------------------------------------------------------------- the shape of assets/


def _dagster_names(module: ast.Module) -> set[str]:
    """Names a module binds from dagster (`from dagster... import X`, `import dagster as dg`)."""
    names = set()
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0].startswith("dagster"):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name.split(".")[0].startswith("dagster")}
    return names


RESOURCE_PARAMS = {"context", "warehouse", "traces"}
RESOURCE_TYPES = {"Warehouse", "TraceFolder"}


def is_adapter(fn: ast.FunctionDef | ast.AsyncFunctionDef, dagster_names: set[str]) -> bool:
    """Uses a dagster name (body, signature or decorator), or takes/uses a context, the warehouse or the traces."""
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    params = {a.arg for a in args}
    return bool(used & dagster_names or params & RESOURCE_PARAMS or used & (RESOURCE_TYPES | RESOURCE_PARAMS))


def non_adapters() -> list[str]:
    out = []
    for path in modules("assets"):
        if path.name == "plots.py":
            continue
        module = tree(path)
        names = _dagster_names(module)
        out += [
            f"{rel(path)}:{fn.lineno}: {fn.name}"
            for fn in module.body
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not is_adapter(fn, names)
        ]
    return out


def test_every_top_level_function_in_assets_is_a_dagster_adapter():
    """A function that touches neither Dagster, nor a context, nor the Warehouse/TraceFolder resources belongs
    in pipelines/, sim/ or models/ (plotting functions in assets/plots.py are the one exception)."""
    assert non_adapters() == []


def test_assets_holds_at_most_2500_lines():
    lines = {rel(p): len(p.read_text().splitlines()) for p in modules("assets")}
    assert sum(lines.values()) <= 2500, sorted(lines.items(), key=lambda kv: -kv[1])
