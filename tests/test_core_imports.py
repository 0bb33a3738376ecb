"""acklane-core stands alone: no module of ``acklane.core`` needs the integration
package or a broker SDK (neither is a dependency of the ``acklane-core`` distribution).

Brokers reach core only through entry points (``acklane.connectors``,
``acklane.demos``, ``acklane.commands``), loaded by name when asked for.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
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
