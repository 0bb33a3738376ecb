"""``acklane store``: read and change the task store and the asset store from a shell.

Values go in and come out as JSON text, one document per command, so the
commands compose with ``jq`` and scripts. Errors go to stderr with exit code 2
(1 for ``get`` of a missing key without ``--default``), secrets masked
(acklane.core.observe.redact).

CONFIG (the first argument, or ``--url``) is read for its ``store`` and ``state``
sections only (a broker's unset variables do not matter). A SQLite file that does
not exist is an error, not a new empty database, except for ``set --create``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ..observe.redact import redact_url
from ..stores import (
    NEVER_EXPIRE,
    AssetStore,
    JsonValue,
    Retention,
    StateBackend,
    StateEntry,
    StateStoreError,
    StateStoreSettings,
    TaskScope,
    TaskStore,
    open_backend,
    validate_key,
)
from ._args import OldConfigOption, OptionalConfigArg, config_given, split_config
from ._exit import FAILED, USAGE, fail
from ._load import load_store

__all__ = ["app"]

app = typer.Typer(
    name="store",
    help="Read and change the task store and the asset store (JSON in, JSON out).",
    no_args_is_help=True,
    add_completion=False,
)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="Database URL of the store, instead of CONFIG."),
]
OffloadOpt = Annotated[
    str | None,
    typer.Option("--offload-dir", help="With --url: directory of offloaded values."),
]
TaskOpt = Annotated[
    str | None,
    typer.Option("--task", "-t", metavar="DAG/RUN/TASK[/MAP]", help="A task instance's store."),
]
AssetOpt = Annotated[
    str | None,
    typer.Option("--asset", "-a", metavar="NAME", help="An asset's store (its name or URI)."),
]

KeyWords = Annotated[
    list[str],
    typer.Argument(
        metavar="[CONFIG] KEY",
        help="The YAML configuration naming the store (instead of --url), then the key.",
        show_default=False,
    ),
]
KeyValueWords = Annotated[
    list[str],
    typer.Argument(
        metavar="[CONFIG] KEY VALUE",
        help="The YAML configuration naming the store (instead of --url), the key, and "
        "JSON text (- reads it from stdin).",
        show_default=False,
    ),
]


CreateOpt = Annotated[
    bool,
    typer.Option(
        "--create",
        help="Create the SQLite database if its file does not exist (else an error).",
    ),
]


def _check_sqlite_file(url: str, create: bool) -> None:
    """Refuse a SQLite file that does not exist (a typo), unless asked to create it."""
    try:
        parsed = make_url(url)
    except Exception:
        return  # open_backend says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or create:
        return
    database = parsed.database
    if database in (None, "", ":memory:") or parsed.query.get("mode") == "memory":
        return
    if str(database).startswith("file:"):
        return  # a SQLite URI: its own rules
    if not Path(str(database)).exists():
        fail(
            f"no SQLite database at {database} (acklane run creates it; "
            "`acklane store set --create` creates an empty one)",
            USAGE,
        )


def _emit(document: Any) -> None:
    typer.echo(json.dumps(document, ensure_ascii=False))


def _load_settings(config: Path) -> tuple[str, StateStoreSettings]:
    loaded = load_store(config)
    return loaded.store.url, loaded.state


@contextmanager
def _opened(
    config: Path | None, url: str | None, offload_dir: str | None, *, create: bool = False
) -> Iterator[StateBackend]:
    if config is not None and url is not None:
        fail("give CONFIG or --url, not both", USAGE)
    if config is not None:
        if offload_dir is not None:
            fail(
                "--offload-dir goes with --url; with CONFIG it comes from state.offload_dir",
                USAGE,
            )
        store_url, settings = _load_settings(config)
    elif url is not None:
        store_url, settings = url, StateStoreSettings(offload_dir=offload_dir)
    else:
        fail("name the store: CONFIG (the YAML's store.url) or --url URL", USAGE)
    _check_sqlite_file(store_url, create)
    try:
        backend = open_backend(store_url, settings)
    except ValueError as exc:
        fail(str(exc), USAGE)
    try:
        yield backend
    except (StateStoreError, ValueError, TypeError) as exc:
        fail(str(exc), USAGE)
    except SQLAlchemyError as exc:
        fail(f"store {redact_url(store_url)!r}: {getattr(exc, 'orig', None) or exc}", USAGE)
    finally:
        backend.close()


def _accessor(backend: StateBackend, task: str | None, asset: str | None) -> TaskStore | AssetStore:
    if (task is None) == (asset is None):
        fail("name one scope: --task DAG/RUN/TASK[/MAP] or --asset NAME", USAGE)
    try:
        if task is not None:
            return TaskStore(TaskScope.parse(task), backend=backend)
        assert asset is not None
        return AssetStore(asset, backend=backend, writer="api")
    except (ValueError, TypeError) as exc:
        fail(str(exc), USAGE)


def _parse_json(text: str, what: str) -> JsonValue:
    def refuse_constant(name: str) -> NoReturn:
        raise ValueError(f"{name} is not JSON")

    try:
        value: JsonValue = json.loads(text, parse_constant=refuse_constant)
    except ValueError as exc:
        fail(f"{what} is not JSON text: {exc}", USAGE)
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _parse_retention(text: str | None) -> Retention:
    if text is None:
        return None
    if text.strip().lower() == "never":
        return NEVER_EXPIRE
    match = _DURATION.match(text)
    if match is None:
        fail(
            f"--retention {text!r}: expected 'never' or a duration such as 3600, 90s, 15m, 12h, 7d",
            USAGE,
        )
    return timedelta(seconds=float(match.group(1)) * _UNIT[match.group(2)])


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


def _entry_document(entry: StateEntry) -> dict[str, Any]:
    document: dict[str, Any] = {
        "key": entry.key,
        "value": entry.value,
        "updated_at": _iso(entry.updated_at),
    }
    if entry.writer is not None:
        document["writer"] = entry.writer
    else:
        document["expires_at"] = _iso(entry.expires_at)
    if entry.ref is not None:
        document["ref"] = entry.ref
    return document


@app.command("get")
def get_command(
    words: KeyWords,
    task: TaskOpt = None,
    asset: AssetOpt = None,
    default: Annotated[
        str | None,
        typer.Option("--default", help="JSON printed when the key is missing (exit 0)."),
    ] = None,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Print KEY's value as JSON (exit 1 if missing, unless --default is given)."""
    config, (key,) = split_config(words, ("KEY",), old_config)
    fallback = None if default is None else _parse_json(default, "--default")
    with _opened(config, url, offload_dir) as backend:
        store = _accessor(backend, task, asset)
        entry = store.entry(key)
    if entry is not None:
        _emit(entry.value)
    elif fallback is not None:
        _emit(fallback)
    else:
        fail(f"key {key!r} not found in {store.backend!r} scope {_scope_name(task, asset)}", FAILED)


def _scope_name(task: str | None, asset: str | None) -> str:
    return f"task {task}" if task is not None else f"asset {asset}"


@app.command("set")
def set_command(
    words: KeyValueWords,
    task: TaskOpt = None,
    asset: AssetOpt = None,
    retention: Annotated[
        str | None,
        typer.Option(
            "--retention",
            help="Task store only: 'never' or a duration (3600, 90s, 15m, 12h, 7d); "
            "default state.default_retention_days.",
        ),
    ] = None,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
    create: CreateOpt = False,
) -> None:
    """Set KEY to the JSON VALUE (an upsert)."""
    config, (key, value) = split_config(words, ("KEY", "VALUE"), old_config)
    text = sys.stdin.read() if value == "-" else value
    parsed = _parse_json(text, "VALUE")
    if retention is not None and asset is not None:
        fail(
            "--retention applies to the task store only; asset keys live until the asset goes",
            USAGE,
        )
    keep = _parse_retention(retention)
    with _opened(config, url, offload_dir, create=create) as backend:
        store = _accessor(backend, task, asset)
        if isinstance(store, TaskStore):
            store.set(key, parsed, retention=keep)
        else:
            store.set(key, parsed)
        entry = store.entry(key)
    _emit(None if entry is None else _entry_document(entry))


@app.command("delete")
def delete_command(
    words: KeyWords,
    task: TaskOpt = None,
    asset: AssetOpt = None,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Delete KEY (a missing key is not an error); print whether it existed."""
    config, (key,) = split_config(words, ("KEY",), old_config)
    with _opened(config, url, offload_dir) as backend:
        store = _accessor(backend, task, asset)
        existed = backend.delete(store.scope, validate_key(key))
    _emit({"key": key, "deleted": existed})


@app.command("list")
def list_command(
    config: OptionalConfigArg = None,
    task: TaskOpt = None,
    asset: AssetOpt = None,
    long: Annotated[
        bool, typer.Option("--long", "-l", help="Print entries with values and times.")
    ] = False,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Print the live keys of a scope as a JSON array."""
    with _opened(config_given(config, old_config), url, offload_dir) as backend:
        store = _accessor(backend, task, asset)
        if long:
            _emit([_entry_document(entry) for entry in store.entries()])
        else:
            _emit(store.keys())


@app.command("clear")
def clear_command(
    config: OptionalConfigArg = None,
    task: TaskOpt = None,
    asset: AssetOpt = None,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Delete every key of a scope (a task scope: that map index only)."""
    with _opened(config_given(config, old_config), url, offload_dir) as backend:
        store = _accessor(backend, task, asset)
        removed = backend.clear(store.scope)
    _emit({"cleared": removed})


@app.command("gc")
def gc_command(
    config: OptionalConfigArg = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be removed; remove nothing.")
    ] = False,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Remove expired task keys and keys of deactivated assets, in batches."""
    with _opened(config_given(config, old_config), url, offload_dir) as backend:
        report = backend.gc(dry_run=dry_run)
    _emit(report.to_dict())


@app.command("deactivate")
def deactivate_command(
    asset: Annotated[str, typer.Option("--asset", "-a", metavar="NAME", help="The asset.")],
    config: OptionalConfigArg = None,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Mark an asset as gone: its keys vanish now, gc removes them, writes are refused."""
    with _opened(config_given(config, old_config), url, offload_dir) as backend:
        backend.deactivate_asset(asset)
    _emit({"asset": asset, "active": False})


@app.command("activate")
def activate_command(
    asset: Annotated[str, typer.Option("--asset", "-a", metavar="NAME", help="The asset.")],
    config: OptionalConfigArg = None,
    old_config: OldConfigOption = None,
    url: UrlOpt = None,
    offload_dir: OffloadOpt = None,
) -> None:
    """Make a deactivated asset writable again, starting empty."""
    with _opened(config_given(config, old_config), url, offload_dir) as backend:
        backend.activate_asset(asset)
    _emit({"asset": asset, "active": True})
