"""The YAML configuration: pydantic models, loading, and errors that say where.

Every problem is reported as ``file:line: field.path: what was expected``, and all
of a file's problems are reported at once in one :class:`ConfigError`. Loading
checks everything that can be checked without connecting: field types, cross
references (a watcher's stream), each stream's block against its connector's
``config_model``, and each watcher's filter (import paths included).

Top-level keys starting with ``x-`` are ignored (a place for YAML anchors).
String values may use ``${NAME}`` and ``${NAME:-default}`` (the default applies
when the variable is unset or empty) to keep secrets out of the file; ``$${``
writes a literal ``${``.

The package's modules, one concept each: ``_errors`` (the problem and error
types), ``_models`` (the pydantic models of the YAML sections), ``_result`` (the
validated configuration), ``_yaml`` (YAML with line numbers), ``_substitution``
(``${NAME}``), ``_messages`` (pydantic errors as sentences), ``_report`` (problems at
their line, raised at once), ``_secrets`` (the file's secrets, registered), ``_load``
(:func:`load_config`; :func:`load_store_config` reads only the ``store`` and ``state``
sections), ``_parse`` (:func:`parse_config`: the sections in order, cross-checked),
one module per section (``_sections``, ``_streams``, ``_watchers``, ``_sinks``),
``_checks`` (the tracing extra, this machine's offline checks) and ``_show`` (the
resolved configuration with its secrets masked). Import from here, not from them.
The user's modules, found beside the configuration without shadowing installed ones,
are imported by :mod:`acklane.core._imports` (below the filters, sinks and stores that
import them too; re-exported here).

Loading registers the file's secrets with :mod:`acklane.core.redact` (SecretStr
fields, secret-like keys, URL passwords, ``${VAR}`` with secret-like names), and no
:class:`ConfigError` message holds one.
"""

from .._imports import add_import_roots, import_user_module
from ..names import NAME_PATTERN
from ._errors import ConfigError, ConfigProblem, Loc, format_path
from ._load import load_config, load_store_config
from ._models import (
    EngineSettings,
    MetricsSettings,
    StoreSettings,
    TracingSettings,
    WatcherSettings,
)
from ._parse import parse_config, parse_store_config
from ._result import AcklaneConfig, StoreConfig, StreamConfig, WatcherConfig
from ._show import config_document

__all__ = [
    "NAME_PATTERN",
    "AcklaneConfig",
    "ConfigError",
    "ConfigProblem",
    "EngineSettings",
    "Loc",
    "MetricsSettings",
    "StoreConfig",
    "StoreSettings",
    "StreamConfig",
    "TracingSettings",
    "WatcherConfig",
    "WatcherSettings",
    "add_import_roots",
    "config_document",
    "format_path",
    "import_user_module",
    "load_config",
    "load_store_config",
    "parse_config",
    "parse_store_config",
]
