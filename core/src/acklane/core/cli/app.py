"""The ``acklane`` command line: run, validate, config, demo, events, store, publish, emulator.

Global options (before the command): ``--version``, ``--log-level`` (or
``ACKLANE_LOG_LEVEL``), ``--log-format`` (``ACKLANE_LOG_FORMAT``) and
``--log-third-party`` (``ACKLANE_LOG_THIRD_PARTY``); see acklane.core.observe.logs. Every
output goes through acklane.core.observe.redact.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

if TYPE_CHECKING:
    from ..config import AcklaneConfig, ConfigProblem
    from ..pipeline.runner import Runner
    from .checks import CheckResult

log = logging.getLogger("acklane.core.cli.app")


class _StartupSignals:
    """SIGINT/SIGTERM while ``acklane run`` starts, before the runner's own handlers.

    Importing the CLI's dependencies, loading the configuration (which imports the
    connectors and the filter modules) and building the runner take seconds, in which
    the default dispositions would kill the process (exit 143) or raise
    KeyboardInterrupt. A signal there is remembered and handed to the runner, which
    then stops before it starts anything (exit 0); a second one exits at once, with
    128 + the signal's number (nothing is in flight yet: nothing is lost).
    """

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.runner: Runner | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        if self._previous:
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        runner = self.runner
        if runner is not None and not runner.stopping:
            # the runner exists, but its event loop has not taken the signals over yet
            self.received = signal.Signals(signum)
            runner.request_stop()
            return
        if self.received is not None:
            # a second signal during start-up: leave now (nothing is in flight yet)
            log.warning("Second signal during start-up: exiting now")
            raise SystemExit(128 + signum)
        self.received = signal.Signals(signum)

    def hand_over(self, runner: Runner) -> None:
        """From now on a signal stops ``runner``; one received already stops it now."""
        self.runner = runner
        if self.received is not None:
            log.info("%s during start-up: stopping before the pipeline starts", self.received.name)
            runner.request_stop()


#: Options of the top-level app that take a value (skipped to find the command).
_GLOBAL_VALUE_OPTIONS = ("--log-level", "--log-format", "--log-third-party")


def _command_of(argv: list[str]) -> str | None:
    """The command word of ``acklane [GLOBAL OPTIONS] COMMAND ...``."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _GLOBAL_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _running_the_pipeline() -> bool:
    """True in the process of an ``acklane run`` command line (not when imported by others)."""
    main = __name__ == "__main__" or Path(sys.argv[0]).stem == "acklane"
    return main and _command_of(sys.argv[1:]) == "run"


# Before anything slow is imported: `acklane run` takes the signals over from here on.
_startup: _StartupSignals | None = None
if _running_the_pipeline():
    _startup = _StartupSignals()
    _startup.install()

import json  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from enum import StrEnum  # noqa: E402
from functools import cache  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperGroup  # noqa: E402

from ..observe.logs import LogFormat, LogLevel, configure_logging, restore_logging  # noqa: E402
from ..observe.redact import guard_std_streams, redact, redact_url  # noqa: E402
from ._config import load as _load  # noqa: E402
from ._console import console as _console  # noqa: E402
from ._console import error as _error  # noqa: E402

if TYPE_CHECKING:
    from typer import _click

# Start-up is part of every command (`acklane --version` is one import of this module and
# typer's): the configuration (pydantic, SQLAlchemy, connectors), rich, asyncio,
# importlib.metadata and each command group's module are imported when a command needs
# them, not with this module. `_LazyGroup` loads a command group when it is run (or
# listed by --help); tests/test_cli_startup.py holds `acklane --version` to that.


class _LazyGroup(TyperGroup):
    """The top-level group: the commands defined here, then those of :data:`_LAZY` and
    of other distributions (entry points ``acklane.commands``), each built when first
    asked for by name (running it, completing it, or listing them all for --help)."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        # as typer lists them: the commands, then the groups (each in its order), then
        # other distributions' commands
        here = super().list_commands(ctx)
        groups = [n for n in here if isinstance(self.commands[n], TyperGroup)]
        names = [n for n in here if n not in groups]
        names += [n for n, (group, _) in _LAZY.items() if not group]
        names += groups
        names += [n for n, (group, _) in _LAZY.items() if group]
        names += [n for n in _plugin_names() if n not in names]
        return names

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None:
            command = _load_command(cmd_name)
            if command is not None:
                self.add_command(command, cmd_name)
        return command


app = typer.Typer(
    name="acklane",
    help="Consume message queues for event-driven pipelines without losing a message.",
    no_args_is_help=True,
    add_completion=True,
    # a traceback's local variables may hold a configuration's secrets
    pretty_exceptions_show_locals=False,
    cls=_LazyGroup,
)


def __getattr__(name: str) -> Any:
    # `console` and `err_console`, as module attributes, without importing rich first
    if name == "console":
        return _console()
    if name == "err_console":
        return _console(stderr=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ConfigArg = Annotated[Path, typer.Argument(help="The pipeline's YAML configuration.")]
LogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level",
        case_sensitive=False,
        help="Level of acklane's logs (overrides the global --log-level).",
        show_default=False,
    ),
]


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class ShowFormat(StrEnum):
    YAML = "yaml"
    JSON = "json"


class _LogOptions:
    """The global logging options, for commands that pick their own default level."""

    level: LogLevel | None = None
    log_format: LogFormat | None = None
    third_party: LogLevel = LogLevel.WARNING


def _setup_logging(own: LogLevel | None, default: LogLevel) -> None:
    """Configure the logs: the command's --log-level, else the global one, else ``default``."""
    configure_logging(
        own or _LogOptions.level or default,
        _LogOptions.log_format,
        third_party=_LogOptions.third_party,
    )


def _version_text() -> str:
    from importlib.metadata import PackageNotFoundError, distributions, version

    def of(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    core = of("acklane-core") or "unknown"
    others = []
    for d in distributions():
        # the name its dist-info directory gives, where it does: no metadata file read
        # for each of the environment's distributions (a hundred take 80 ms)
        quick = getattr(d, "_normalized_name", None)
        if isinstance(quick, str) and not quick.startswith("acklane"):
            continue
        name = d.metadata["Name"] or ""
        if name.startswith("acklane-") and name != "acklane-core":
            others.append(f"{name} {d.version}")
    others.sort()
    parts = [f"acklane-core {core}", *others, f"Python {sys.version.split()[0]}"]
    return f"acklane {of('acklane') or core} ({', '.join(parts)})"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(_version_text())
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            "--log-level",
            envvar="ACKLANE_LOG_LEVEL",
            case_sensitive=False,
            help="Level of acklane's logs, for every command. "
            "Default: INFO for run, WARNING otherwise.",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        LogFormat | None,
        typer.Option(
            "--log-format",
            envvar="ACKLANE_LOG_FORMAT",
            case_sensitive=False,
            help="rich (columns for a terminal), text (one line per record) or json "
            "(one object per line). Default: rich on a terminal, text otherwise.",
            show_default=False,
        ),
    ] = None,
    log_third_party: Annotated[
        LogLevel,
        typer.Option(
            "--log-third-party",
            envvar="ACKLANE_LOG_THIRD_PARTY",
            case_sensitive=False,
            help="Level of other libraries' logs (aiosqlite, botocore, urllib3, asyncio, "
            "sqlalchemy...).",
        ),
    ] = LogLevel.WARNING,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print acklane's version (and its installed distributions) and exit.",
        ),
    ] = False,
) -> None:
    """Consume message queues for event-driven pipelines without losing a message."""
    _LogOptions.level = log_level
    _LogOptions.log_format = log_format
    _LogOptions.third_party = log_third_party
    # Secrets known to the process are masked in everything written to stdout/stderr.
    ctx.with_resource(guard_std_streams())
    ctx.call_on_close(restore_logging)
    _setup_logging(None, LogLevel.WARNING)


def _problem_document(problem: ConfigProblem) -> dict[str, Any]:
    return {
        "file": problem.source,
        "line": problem.line,
        "field": problem.path,
        "message": problem.message,
    }


@app.command()
def validate(
    config: ConfigArg,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="text: a table, or the problems on stderr; json: one document on stdout "
            "with the problems as {file, line, field, message}.",
        ),
    ] = OutputFormat.TEXT,
    connect: Annotated[
        bool,
        typer.Option(
            "--connect",
            help="Also reach the event store and each stream's broker (read-only: nothing "
            "is received, sent, committed or created), one line per check.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="With --connect: seconds each call to the store or a broker may take.",
        ),
    ] = 10.0,
) -> None:
    """Check a configuration: every problem names the file, the line and the field.

    Offline, it also checks this machine: the store URL's scheme, the SQLite file's
    directory (exists, writable), the PostgreSQL driver, files a stream names.
    Exit code 0 when valid, 2 when not, 3 when valid but a --connect check failed.
    """
    from ..config import ConfigError, load_config

    try:
        with warnings.catch_warnings():
            # old names of settings: reported below, with the rest, not as Python warnings
            warnings.simplefilter("ignore", FutureWarning)
            cfg = load_config(config, offline_checks=True)
    except ConfigError as exc:
        if output is OutputFormat.JSON:
            problems = [_problem_document(p) for p in exc.problems]
            typer.echo(
                redact(json.dumps({"file": str(config), "valid": False, "problems": problems}))
            )
        else:
            _error(str(exc), title="invalid configuration")
        raise typer.Exit(2) from None
    keys = {cfg.streams[w.stream].key for w in cfg.watchers}
    store = redact(redact_url(cfg.store.url))
    checks = _connection_checks(cfg, timeout) if connect else None
    failed = checks is not None and not all(c.ok for c in checks)
    if output is OutputFormat.JSON:
        document: dict[str, Any] = {
            "file": str(config),
            "valid": True,
            "problems": [],
            "store": store,
            "upstream_polls": len(keys),
            "watchers": [
                {
                    "name": w.name,
                    "stream": w.stream,
                    "shared_poll": cfg.streams[w.stream].describe(),
                    "asset": w.asset,
                }
                for w in cfg.watchers
            ],
            "deprecations": [_problem_document(d) for d in cfg.deprecations],
            "warnings": [_problem_document(w) for w in cfg.warnings],
        }
        if checks is not None:
            document["connected"] = not failed
            document["checks"] = [c.document() for c in checks]
        typer.echo(redact(json.dumps(document)))
        if failed:
            raise typer.Exit(3)
        return
    from rich.table import Table
    from rich.text import Text

    console = _console()
    table = Table(title=f"{config}: valid")
    table.add_column("watcher")
    table.add_column("stream")
    table.add_column("shared poll (connector and key)")
    table.add_column("asset")
    for w in cfg.watchers:
        stream = cfg.streams[w.stream]
        table.add_row(w.name, w.stream, redact(stream.describe()), w.asset or "-")
    console.print(table)
    summary = (
        f"{len(cfg.watchers)} watchers share {len(keys)} upstream poll(s); events stored in {store}"
    )
    console.print(Text(summary), soft_wrap=True)
    for deprecation in cfg.deprecations:  # they work; say so, and their new names
        console.print(Text("old name ", style="yellow") + Text(str(deprecation)), soft_wrap=True)
    for warning in cfg.warnings:  # they work too, and expose what they carry
        console.print(Text("warning ", style="yellow") + Text(str(warning)), soft_wrap=True)
    if checks is not None:
        for check in checks:
            style = {"ok": "green", "failed": "red", "skipped": "yellow"}[check.status]
            line = Text(f"{check.status:<7}", style=style)
            line.append(redact(f" {check.target} ({check.setting}): {check.detail}"))
            console.print(line, soft_wrap=True)
        if failed:
            raise typer.Exit(3)


def _connection_checks(cfg: AcklaneConfig, timeout: float) -> list[CheckResult]:
    """``validate --connect``: the store's and each upstream's check, each bounded."""
    import asyncio

    from .checks import run_checks

    return asyncio.run(run_checks(cfg, call_timeout=timeout))


config_app = typer.Typer(
    name="config",
    help="Look at a configuration as acklane reads it.",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    config: ConfigArg,
    output: Annotated[
        ShowFormat, typer.Option("--format", case_sensitive=False, help="yaml or json.")
    ] = ShowFormat.YAML,
) -> None:
    """Print the resolved configuration: defaults filled in, ${VAR}s substituted, secrets
    masked as ***."""
    from ..config import config_document

    document = config_document(_load(config))
    if output is ShowFormat.JSON:
        text = json.dumps(document, indent=2, ensure_ascii=False)
    else:
        import yaml

        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True).rstrip("\n")
    typer.echo(redact(text))


@app.command()
def run(
    config: ConfigArg,
    log_level: LogLevelOption = None,
    no_sinks: Annotated[
        bool,
        typer.Option(
            "--no-sinks",
            help="Store the events but deliver none: `acklane sinks run` does, in its own process.",
        ),
    ] = False,
) -> None:
    """Run the pipeline until SIGINT/SIGTERM, then shut down gracefully."""
    global _startup
    startup, _startup = _startup or _StartupSignals(), None
    startup.install()  # first (a no-op when the module did it as it was imported)
    try:
        _setup_logging(log_level, LogLevel.INFO)
        log.info("Starting the pipeline of %s", config)
        cfg = _load(config)
        import asyncio

        from ..errors import AcklaneError
        from ..observe.metrics import start_metrics_server
        from ..pipeline.runner import Runner

        runner: Runner | None = None
        try:
            runner = Runner(cfg, deliver_sinks=not no_sinks)
            startup.hand_over(runner)
            if cfg.metrics.port is not None and not runner.stopping:
                start_metrics_server(cfg.metrics.port, runner, addr=cfg.metrics.host)
            asyncio.run(runner.run())
        except (asyncio.CancelledError, KeyboardInterrupt):
            if runner is None or runner.forced_by is None:
                raise
            # a second signal cut the graceful stop short: told below
        except Exception as exc:
            # one record (and the traceback at DEBUG), not a screenful on stderr; an
            # error of acklane's own says what is wrong in its message
            why = str(exc) if isinstance(exc, AcklaneError) else f"{type(exc).__name__}: {exc}"
            log.error("acklane run failed: %s", why)
            log.debug("acklane run failed", exc_info=True)
            raise typer.Exit(1) from None
        if runner is not None and runner.forced_by is not None:
            # one line and the conventional code, however the cut-short stop ended
            log.warning("Stopped at once by a second %s", runner.forced_by.name)
            raise typer.Exit(128 + runner.forced_by)
        if runner is not None and runner.failure is not None:
            # the runner gave up (it logged why): exit 1, as for a failure to start
            raise typer.Exit(1)
    finally:
        startup.restore()


#: Entry-point groups read here (``acklane.core.cli.demo.ENTRY_POINT_GROUP`` is the first).
DEMO_BROKERS_GROUP = "acklane.demos"  # name -> a DemoBroker subclass, for `acklane demo`
COMMANDS_GROUP = "acklane.commands"  # name -> a typer.Typer, added as `acklane NAME ...`


def _entry_points(group: str) -> Any:
    from importlib.metadata import entry_points

    return entry_points(group=group)


def _demo_broker_names() -> list[str]:
    """``--broker`` values: auto, memory and the registered demo brokers (not imported)."""
    registered = {ep.name for ep in _entry_points(DEMO_BROKERS_GROUP)} - {"auto", "memory"}
    return ["auto", "memory", *sorted(registered)]


def _demo_app() -> typer.Typer:
    """``acklane demo`` (its --broker help lists the registered demo brokers)."""
    holder = typer.Typer()

    @holder.command("demo")
    def demo(
        messages: Annotated[int, typer.Option(min=6, max=500, help="How many messages.")] = 24,
        broker: Annotated[
            str,
            typer.Option(
                help="auto: the first registered demo broker that can start (a Kafka emulator "
                "with acklane-integration), else the in-process broker; memory: the in-process "
                f"broker; or a registered one (entry points {DEMO_BROKERS_GROUP}). "
                f"Known: {', '.join(_demo_broker_names())}.",
            ),
        ] = "auto",
        log_level: Annotated[
            LogLevel | None,
            typer.Option(
                "--log-level",
                case_sensitive=False,
                help="Default WARNING; DEBUG shows the broker's logs too.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Run a demo pipeline on embedded defaults and show what becomes of each message."""
        _run_demo(messages, broker, log_level)

    return holder


def _run_demo(messages: int, broker: str, log_level: LogLevel | None) -> None:
    _setup_logging(log_level, LogLevel.WARNING)
    known = _demo_broker_names()
    if broker not in known:
        from .extras import SIBLING_DEMO_BROKERS, missing_demo_broker

        if broker in SIBLING_DEMO_BROKERS:
            _error(f"--broker {broker}: {missing_demo_broker(broker)}")
        else:
            _error(f"--broker {broker!r}: no such demo broker (known: {', '.join(known)})")
        raise typer.Exit(2)
    import asyncio

    from rich.text import Text

    from .demo import UnknownDemoBroker, run_demo

    try:
        code = asyncio.run(run_demo(messages, _console(), broker))
    except UnknownDemoBroker as exc:
        _error(str(exc))
        raise typer.Exit(2) from None
    except Exception as exc:
        log.debug("acklane demo --broker %s failed", broker, exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _error(f"acklane demo --broker {broker} failed: {type(exc).__name__}: {first}")
        _console(stderr=True).print(Text("(--log-level DEBUG shows the traceback)", style="dim"))
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _events_app() -> typer.Typer:
    from .events import app as events_app
    from .sinks import replay

    events_app.command("replay")(replay)
    holder = typer.Typer()
    holder.add_typer(events_app, name="events", help="See the trigger events that fired.")
    return holder


def _sinks_app() -> typer.Typer:
    from .sinks import app as sinks_app

    holder = typer.Typer()
    holder.add_typer(sinks_app, name="sinks", help="See and steer the delivery to sinks.")
    return holder


def _store_app() -> typer.Typer:
    from .store import app as store_app

    holder = typer.Typer()
    holder.add_typer(store_app, name="store", help="Read and write the task and asset stores.")
    return holder


def _publish_app() -> typer.Typer:
    from .publish import publish as publish_command

    holder = typer.Typer()
    holder.command("publish")(publish_command)
    return holder


def _dlq_app() -> typer.Typer:
    from .dlq import app as dlq_app

    holder = typer.Typer()
    holder.add_typer(dlq_app, name="dlq")  # its help is the dlq app's own
    return holder


def _top_app() -> typer.Typer:
    from .top import top as top_command

    holder = typer.Typer()
    holder.command("top")(top_command)
    return holder


def _test_app() -> typer.Typer:
    from .pipeline_test import run_tests as test_command

    holder = typer.Typer()
    holder.command("test")(test_command)
    return holder


#: acklane's commands defined outside this module (or costly to define), in --help's
#: order: name -> (whether it is a group, a function returning a Typer that holds that
#: one command or group under that name), called only when the command is asked for.
_LAZY: dict[str, tuple[bool, Callable[[], typer.Typer]]] = {
    "demo": (False, _demo_app),
    "top": (False, _top_app),
    "publish": (False, _publish_app),
    "test": (False, _test_app),
    "events": (True, _events_app),
    "sinks": (True, _sinks_app),
    "store": (True, _store_app),
    "dlq": (True, _dlq_app),
}


@cache
def _plugin_names() -> tuple[str, ...]:
    """Names of the commands of other distributions (entry points), then of acklane's
    own distributions' commands whose distribution is not installed."""
    from .extras import SIBLING_COMMANDS

    names = [ep.name for ep in _entry_points(COMMANDS_GROUP)]
    return (*dict.fromkeys(names), *(n for n in SIBLING_COMMANDS if n not in names))


def _load_command(name: str) -> _click.Command | None:
    """The click command ``acklane NAME`` runs, built now; None when there is none."""
    lazy = _LAZY.get(name)
    if lazy is not None:
        holder = lazy[1]()
    elif name in _plugin_names():
        holder = _plugin_app(name)
    else:
        return None
    command: _click.Command = typer.main.get_group(holder).commands[name]
    return command


def _plugin_app(name: str) -> typer.Typer:
    """``acklane NAME`` of another distribution (acklane-integration: `acklane emulator`)."""
    holder = typer.Typer()
    for ep in _entry_points(COMMANDS_GROUP):
        if ep.name != name:
            continue
        distribution = ep.dist.metadata["Name"] if ep.dist is not None else ep.value
        try:
            sub = ep.load()
        except Exception as exc:  # a broken plugin must not break `acklane run`
            log.debug("acklane %s (%s) is unavailable", ep.name, ep.value, exc_info=True)
            _add_unavailable(holder, name, distribution, f"{type(exc).__name__}: {exc}")
            return holder
        if isinstance(sub, typer.Typer):
            holder.add_typer(sub, name=name)
            return holder
        log.warning("entry point %s of %s is not a typer.Typer", ep.name, COMMANDS_GROUP)
    # acklane's own distributions' commands, when that distribution is not installed
    from .extras import SIBLING_COMMANDS

    _add_unavailable(holder, name, SIBLING_COMMANDS.get(name, "an acklane distribution"))
    return holder


def _add_unavailable(
    holder: typer.Typer, name: str, distribution: str, problem: str | None = None
) -> None:
    """``acklane NAME ...`` that says what to install (or what broke), not "No such command"."""
    from .extras import missing_command

    def unavailable(ctx: typer.Context) -> None:
        _error(missing_command(name, distribution, problem, ctx.args))
        raise typer.Exit(2)

    unavailable.__doc__ = f"(not available) {missing_command(name, distribution, problem)}"
    holder.command(
        name,
        add_help_option=False,  # --help too says what to install
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(unavailable)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
