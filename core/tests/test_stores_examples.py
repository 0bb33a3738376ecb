"""The documented examples run and show what the docs say they show."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_killed_worker_is_retried_and_reattaches_to_the_stored_job_id(
    db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    example = _example("state_store_job_id")
    submissions = example.demo(db_url, tmp_path)
    out = capfd.readouterr().out
    assert submissions == 1
    assert "attempt 1: submitted job-1" in out
    assert "worker of attempt 1 killed (status -9)" in out
    assert "attempt 2: reattached to job-1" in out
    assert "'attempt': 2" in out


def test_the_watermark_advances_run_by_run(db_url: str, tmp_path: Path) -> None:
    example = _example("state_store_watermark")
    assert example.demo(db_url, tmp_path) == [["a.csv", "b.csv"], ["c.csv"], []]
