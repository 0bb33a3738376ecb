"""What tests of the engine, of a connector and of a pipeline share, with core alone.

:func:`eventually` is the one wait of every test that waits for something to have
happened; :mod:`acklane.integration.testing` re-exports it beside its helpers that
need brokers and processes.

:func:`assert_pipeline_tests` (and :func:`run_pipeline_tests`, which returns the
results) runs a pipeline's test cases from a user's own pytest, as ``acklane test``
does (docs/testing.md); :mod:`acklane.testing` is the short name of this module.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from .producer import AdvanceOutcome

if TYPE_CHECKING:
    from .config import AcklaneConfig
    from .harness.cases import CaseResult

__all__ = [
    "CLEAN",
    "FAILED",
    "UNCLAIMED",
    "assert_pipeline_tests",
    "eventually",
    "rejected",
    "run_pipeline_tests",
    "run_pipeline_tests_async",
]

#: The outcome of a message every watcher accepted (one watcher).
CLEAN: Final = AdvanceOutcome(acked=1, failed=0)
#: The outcome of a message a watcher failed: it must come again.
FAILED: Final = AdvanceOutcome(acked=0, failed=1)
#: The outcome of a message no watcher received: it must come again.
UNCLAIMED: Final = AdvanceOutcome(acked=0, failed=0)


def rejected(*reasons: str) -> AdvanceOutcome:
    """The outcome of a message a watcher rejected, with the reasons it gave."""
    return AdvanceOutcome(acked=0, failed=0, rejected=1, reject_reasons=reasons)


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    within: float = 20.0,
    *,
    every: float = 0.01,
) -> None:
    """Wait until ``check()`` (sync or async) holds, asking every ``every`` seconds.

    Not ``within`` seconds: AssertionError ``not within {within}s: {what}``.
    """
    try:
        async with asyncio.timeout(within):
            while True:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(every)
    except TimeoutError:
        raise AssertionError(f"not within {within}s: {what}") from None


PathLike = str | os.PathLike[str]


async def run_pipeline_tests_async(
    config: PathLike | AcklaneConfig,
    *files: PathLike,
    select: str | None = None,
    within: float = 30.0,
) -> list[CaseResult]:
    """Run a pipeline's test cases (``acklane test``) and return one result per case.

    ``config`` is the pipeline's YAML file (or a loaded configuration); ``files`` are
    case files, by default those found beside the pipeline (``<name>.tests.yaml``,
    ``<name>.tests/*.yaml``). ``select`` keeps the cases whose name contains it; a
    case whose message is not resolved within ``within`` seconds fails. Raises
    :class:`~acklane.core.errors.ConfigError` for problems in the files, and
    ValueError when no case was found.
    """
    from .config import AcklaneConfig, load_config
    from .harness.cases import case_files, load_cases
    from .harness.run import run_cases

    cfg = config if isinstance(config, AcklaneConfig) else load_config(config)
    paths = list(files) or (case_files(cfg.source) if not cfg.source.startswith("<") else [])
    if not paths:
        raise ValueError(f"no test case files for {cfg.source} (<name>.tests.yaml beside it)")
    cases = [c for c in load_cases(paths, cfg) if select is None or select in c.name]
    if not cases:
        raise ValueError(f"no test case in {', '.join(map(str, paths))} (select={select!r})")
    return await run_cases(cfg, cases, within=within)


def run_pipeline_tests(
    config: PathLike | AcklaneConfig,
    *files: PathLike,
    select: str | None = None,
    within: float = 30.0,
) -> list[CaseResult]:
    """:func:`run_pipeline_tests_async` from synchronous code (a plain pytest test)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "run_pipeline_tests() runs its own event loop; in an async test, "
            "await run_pipeline_tests_async(...) instead"
        )
    return asyncio.run(run_pipeline_tests_async(config, *files, select=select, within=within))


def assert_pipeline_tests(
    config: PathLike | AcklaneConfig,
    *files: PathLike,
    select: str | None = None,
    within: float = 30.0,
) -> list[CaseResult]:
    """Run a pipeline's test cases; AssertionError with every failure and its diff."""
    from .harness.cases import describe_failure

    results = run_pipeline_tests(config, *files, select=select, within=within)
    failed = [r for r in results if not r.passed]
    if failed:
        text = "\n\n".join(describe_failure(r) for r in failed)
        count = f"{len(failed)} of {len(results)} pipeline test case(s) failed"
        raise AssertionError(f"{count}:\n{text}")
    return results
