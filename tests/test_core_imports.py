"""The import graph: acklane-core stands alone, its layers have no upward import and
no cycle, and each distribution depends only downward.

No module of ``acklane.core`` needs the integration package or a broker SDK (neither
is a dependency of the ``acklane-core`` distribution): brokers reach core only through
entry points (``acklane.connectors``, ``acklane.demos``, ``acklane.commands``), loaded
by name when asked for.

Core's layers (docs/architecture.md, "Layers") are checked on every import the code
names, read from the source: those under ``if TYPE_CHECKING:`` and those inside a
function count too, since they are dependencies all the same (a cycle that holds only
because one side imports late is still a cycle).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import acklane.core

#: What acklane-core must not import: acklane's other distributions and broker SDKs.
FORBIDDEN = (
    "acklane.integration",
    "acklane.connectors",
    "confluent_kafka",
    "aioboto3",
    "aiobotocore",
    "boto3",
    "botocore",
)

#: What acklane-core itself ships under those names: the namespace and the memory connector.
ALLOWED = ("acklane.connectors", "acklane.connectors.memory")

CORE = Path(acklane.core.__file__).parent


def _core_modules() -> list[str]:
    modules = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "__main__.py":
            continue  # importing it runs the program (`python -m acklane.core.cli`)
        parts = ["acklane", "core", *path.relative_to(CORE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules.append(".".join(parts))
    return modules


def _forbidden(name: str) -> bool:
    allowed = name == ALLOWED[0] or any(name == a or name.startswith(a + ".") for a in ALLOWED[1:])
    return not allowed and any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


IMPORT_ALL = """
import importlib, importlib.abc, json, sys, traceback

FORBIDDEN = {forbidden!r}
ALLOWED = {allowed!r}


def forbidden(name):
    if name == ALLOWED[0] or any(name == a or name.startswith(a + ".") for a in ALLOWED[1:]):
        return False
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if forbidden(name):
            raise ImportError(f"{{name}} is not installed (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, Block())
failures = {{}}
for module in {modules!r}:
    try:
        importlib.import_module(module)
    except BaseException:
        failures[module] = traceback.format_exc()
loaded = sorted(m for m in sys.modules if forbidden(m))
print(json.dumps({{"failures": failures, "loaded": loaded}}))
"""


def test_every_core_module_imports_without_integration_or_broker_sdks() -> None:
    modules = _core_modules()
    assert "acklane.core.cli.demo" in modules
    assert "acklane.core.cli.app" in modules
    script = IMPORT_ALL.format(forbidden=FORBIDDEN, allowed=ALLOWED, modules=modules)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failures"] == {}, "\n".join(result["failures"].values())
    assert result["loaded"] == []


#: Entry-point group names that read like module names (``acklane.connectors``).
ENTRY_POINT_GROUPS = {"acklane.connectors", "acklane.demos", "acklane.commands"}
_MODULE_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*(:[\w.]+)?$")


def test_core_source_names_no_integration_module_or_broker_sdk() -> None:
    """No import statement, and no module path in a string (``import_module``, entry points)."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _MODULE_REFERENCE.match(node.value)
                and node.value not in ENTRY_POINT_GROUPS
            ):
                names = [node.value.split(":")[0]]
            where = f"{path.relative_to(CORE)}:{getattr(node, 'lineno', '?')}"
            found += [f"{where}: {name}" for name in names if _forbidden(name)]
    assert found == [], "\n".join(found)


# --- core's layers -------------------------------------------------------------------

#: Core's layers, from the bottom. A module may import modules of its own layer and of
#: the layers below, never above. A name matches the module and every module under it;
#: the longest match wins. A module matched by none fails the test: give it a layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "acklane.core.errors",
            "acklane.core.redact",
            "acklane.core.names",
            "acklane.core.durations",
            "acklane.core.deprecation",
            "acklane.core._dbconf",
            "acklane.core._imports",
            "acklane.core._lazy",
            "acklane.core._section",
        ),
    ),
    (
        "contract",
        (
            "acklane.core.trigger",
            "acklane.core.message",
            "acklane.core.producer",
            "acklane.core.sql",
        ),
    ),
    (
        "engine and stores",
        (
            "acklane.core.manager",
            "acklane.core.events",
            "acklane.core.stores",
            "acklane.core.events.attempts",
        ),
    ),
    (
        "connector kit and filter language",
        (
            "acklane.core.connectors",
            "acklane.core.pipeline.filters",
            "acklane.core.pipeline.schema",
        ),
    ),
    ("in-process broker", ("acklane.connectors.memory",)),
    ("sinks", ("acklane.core.sinks",)),
    ("observe", ("acklane.core.observe",)),
    ("config", ("acklane.core.config",)),
    ("pipeline", ("acklane.core.pipeline",)),
    # /metrics and /healthz of a running Runner, which it reads: above the pipeline
    ("endpoints", ("acklane.core.observe.metrics",)),
    (
        "test harness",
        (
            "acklane.core.harness",
            "acklane.core.testing",
            "acklane.testing",
        ),
    ),
    ("cli", ("acklane.core.cli",)),
)

#: ``acklane.core`` itself, the public names re-exported from the contract and the
#: engine: it sits with the engine, and matches no module beneath it.
ROOT = ("acklane.core", "engine and stores")

#: Imports the layers forbid that are still there, each named with what removes it.
#: The test fails on any other, and on one of these that is gone (delete it here).
KNOWN: dict[tuple[str, str], str] = {}

#: Each distribution's sources, and the distributions it may import.
DISTRIBUTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "core": ("core/src", ()),
    "kafka": ("connectors/kafka/src", ("core",)),
    "sqs": ("connectors/sqs/src", ("core",)),
    "pubsub": ("connectors/pubsub/src", ("core",)),
    "servicebus": ("connectors/servicebus/src", ("core",)),
    "integration": ("integration/src", ("core", "kafka", "sqs", "pubsub", "servicebus")),
    "airflow": ("providers/airflow/src", ("core", "kafka", "sqs", "pubsub", "servicebus")),
}
REPO = Path(__file__).resolve().parent.parent


def _modules_of(src: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package's ``__init__``)."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        modules[".".join(parts)] = (path, package)
    return modules


def _imported(module: str, package: bool, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Every module name an import of ``tree`` names (``from m import x``: ``m`` and
    ``m.x``, one of them a module), with its line; relative imports resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: None if package else -1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, node.module] if node.module else parts)
            yield base, node.lineno
            yield from ((f"{base}.{alias.name}", node.lineno) for alias in node.names)


def _graph() -> tuple[dict[str, str], dict[tuple[str, str], int]]:
    """acklane's modules (name -> distribution) and their imports of one another
    ((importer, imported) -> the first line)."""
    owner: dict[str, str] = {}
    files = {}
    for dist, (src, _) in DISTRIBUTIONS.items():
        for name, found in _modules_of(REPO / src).items():
            owner[name] = dist
            files[name] = found
    edges: dict[tuple[str, str], int] = {}
    for name, (path, package) in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, line in _imported(name, package, tree):
            while target not in owner and "." in target:
                target = target.rsplit(".", 1)[0]  # a name in a module: the module
            if target in owner and target != name:
                edges.setdefault((name, target), line)
    return owner, edges


OWNER, EDGES = _graph()


def _layer(module: str) -> int | None:
    names = [layer for layer, _ in LAYERS]
    if module == ROOT[0]:
        return names.index(ROOT[1])
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1] if matches else None


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module)."""
    following: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        following.setdefault(a, []).append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in following.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(following):
        if v not in index:
            visit(v)
    return found


def _core_edges() -> dict[tuple[str, str], int]:
    return {e: line for e, line in EDGES.items() if OWNER[e[0]] == OWNER[e[1]] == "core"}


def test_every_core_module_has_a_layer() -> None:
    core = [m for m, dist in OWNER.items() if dist == "core"]
    assert "acklane.core.cli.app" in core
    assert [m for m in core if _layer(m) is None] == []


def test_no_core_module_imports_a_layer_above_its_own() -> None:
    names = [layer for layer, _ in LAYERS]
    upward = []
    for (a, b), line in sorted(_core_edges().items()):
        la, lb = _layer(a), _layer(b)
        if la is not None and lb is not None and lb > la and (a, b) not in KNOWN:
            upward.append(f"{a}:{line} ({names[la]}) imports {b} ({names[lb]})")
    assert upward == [], "\n".join(upward)


def test_core_has_no_import_cycle() -> None:
    cycles = _cycles(set(_core_edges()) - set(KNOWN))
    assert cycles == [], "\n".join(" <-> ".join(c) for c in cycles)


def test_a_package_split_across_layers_imports_nothing() -> None:
    """Importing ``pipeline.filters`` runs ``pipeline/__init__`` first: a package with a
    module in a layer below its own must not bring its higher layer along."""
    core = [m for m, dist in OWNER.items() if dist == "core"]
    heavy = []
    # acklane.core itself imports its public names when first used, not with the package
    for package in (m for m in core if m != ROOT[0]):
        layer = _layer(package)
        below = [m for m in core if m.startswith(package + ".") and (_layer(m) or 0) < (layer or 0)]
        imports = sorted(b for a, b in _core_edges() if a == package)
        if below and imports:
            heavy.append(f"{package} (holds {below[0]}) imports {', '.join(imports)}")
    assert heavy == [], "\n".join(heavy)


def test_every_known_exception_is_still_there() -> None:
    gone = sorted(f"{a} -> {b}" for a, b in KNOWN if (a, b) not in EDGES)
    assert gone == [], "gone (delete them from KNOWN): " + ", ".join(gone)


def test_each_distribution_imports_only_downward_and_has_no_cycle() -> None:
    wrong = [
        f"{a}:{line} ({OWNER[a]}) imports {b} ({OWNER[b]})"
        for (a, b), line in sorted(EDGES.items())
        if OWNER[a] != OWNER[b] and OWNER[b] not in DISTRIBUTIONS[OWNER[a]][1]
    ]
    assert wrong == [], "\n".join(wrong)
    for dist in DISTRIBUTIONS:
        if dist == "core":
            continue  # its cycles: test_core_has_no_import_cycle
        inside = {(a, b) for a, b in EDGES if OWNER[a] == OWNER[b] == dist}
        assert _cycles(inside) == [], dist
