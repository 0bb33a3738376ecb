"""``acklane test CONFIG [FILES...]``: a pipeline's test cases, run through its own watchers.

No broker and no store: each case's message goes through the configuration's
compiled filters on the in-process memory broker, with the engine's reject and
poison rules (:mod:`acklane.core.harness.run`). The case files are those named,
or ``<config>.tests.yaml`` and ``<config>.tests/*.yaml`` beside the configuration
(:mod:`acklane.core.harness.cases` has the format).

Output as pytest's: one line per case, then each failure with its diff of expected
and actual; ``--format junit`` writes a JUnit XML report on stdout instead, for CI.
Exit codes: 0 every case passed; 1 a case failed; 2 the configuration or a case
file has problems (each with its file, line and field), or no case was found.
"""

from __future__ import annotations

import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from ._exit import USAGE, fail
from ._load import read
from ._text import cell

if TYPE_CHECKING:
    from ..harness.cases import CaseResult

__all__ = ["junit_report", "run_tests"]

_out = Console(highlight=False, soft_wrap=True)


class ReportFormat(StrEnum):
    TEXT = "text"
    JUNIT = "junit"


def run_tests(
    config: Annotated[
        Path,
        typer.Argument(help="The pipeline's YAML configuration.", show_default=False),
    ],
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Case files (default: CONFIG's <name>.tests.yaml and <name>.tests/*.yaml).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        ReportFormat,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="text: one line per case, then the failures with their diffs; junit: a "
            "JUnit XML report on stdout, for CI.",
        ),
    ] = ReportFormat.TEXT,
    select: Annotated[
        str | None,
        typer.Option("-k", help="Only the cases whose name contains this text."),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", min=0.1, help="Seconds a case's message may take to be resolved."
        ),
    ] = 30.0,
) -> None:
    """Run a pipeline's test cases through its watchers: no broker, no store needed.

    Each case is a message (body, key, attributes, stream) and what each watcher
    must do with it (fire these payloads, reject with a reason matching a pattern, or
    nothing) and what the dead-letter destination gets. Exit code 0 when every case
    passed, 1 when one failed, 2 for problems in the files.
    """
    import asyncio

    from ..config import ConfigError
    from ..harness.cases import case_files, load_cases
    from ..harness.run import run_cases

    try:
        cfg = read(config)
        paths = list(files) if files else case_files(config)
        if not paths:
            stem = config.name.rsplit(".", 1)[0]
            fail(
                f"no test cases for {config}: write {config.with_name(stem + '.tests.yaml')} "
                f"(or files in {config.with_name(stem + '.tests')}/), or name case files",
                USAGE,
            )
        cases = load_cases(paths, cfg)
    except ConfigError as exc:
        fail(str(exc), USAGE, title="invalid configuration or test cases")
    if select:
        cases = [c for c in cases if select in c.name]
    if not cases:
        fail(f"no test case matches -k {select!r}", USAGE)
    started = time.monotonic()
    if output is ReportFormat.TEXT:
        _out.print(Text(f"acklane test: {config}: {len(cases)} case(s)", style="bold"))
    results = asyncio.run(run_cases(cfg, cases, within=timeout))
    seconds = time.monotonic() - started
    if output is ReportFormat.JUNIT:
        sys.stdout.write(junit_report(results, seconds) + "\n")  # as is: no markup, no wrap
        sys.stdout.flush()
    else:
        _text_report(results, seconds)
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


def _text_report(results: list[CaseResult], seconds: float) -> None:
    from ..harness.cases import describe_failure

    for result in results:
        verdict = Text("PASSED", style="green") if result.passed else Text("FAILED", style="red")
        _out.print(Text.assemble(f"{result.case.id} ", verdict))
    failed = [r for r in results if not r.passed]
    width = max(40, min(_out.width, 100))
    if failed:
        _out.print(Text(" FAILURES ".center(width, "="), style="red"))
        for result in failed:
            title = f" {result.case.name} "
            _out.print(Text(title.center(width, "_"), style="red"))
            _out.print(cell(describe_failure(result), lines=True))  # payloads, errors
    parts = [f"{len(failed)} failed"] if failed else []
    parts.append(f"{len(results) - len(failed)} passed")
    summary = f" {', '.join(parts)} in {seconds:.2f}s "
    _out.print(Text(summary.center(width, "="), style="red" if failed else "green"))


def junit_report(results: list[CaseResult], seconds: float) -> str:
    """The results as JUnit XML: one testsuite per case file, one testcase per case."""
    import xml.etree.ElementTree as ET

    from ..harness.cases import describe_failure

    root = ET.Element("testsuites", name="acklane test", time=f"{seconds:.3f}")
    by_file: dict[str, list[CaseResult]] = {}
    for result in results:
        by_file.setdefault(result.case.file, []).append(result)
    for file, group in by_file.items():
        suite = ET.SubElement(
            root,
            "testsuite",
            name=file,
            tests=str(len(group)),
            failures=str(sum(1 for r in group if r.failures and r.error is None)),
            errors=str(sum(1 for r in group if r.error is not None)),
            time=f"{sum(r.seconds for r in group):.3f}",
        )
        for result in group:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=file,
                name=result.case.name,
                file=file,
                line=str(result.case.line or 0),
                time=f"{result.seconds:.3f}",
            )
            if result.passed:
                continue
            tag = "error" if result.error is not None else "failure"
            first = result.error or (result.failures[0] if result.failures else "failed")
            element = ET.SubElement(case, tag, message=first)
            element.text = describe_failure(result)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")
