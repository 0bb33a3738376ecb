"""The README's promise: ``acklane demo`` runs to completion and shows every outcome."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from acklane.core.demo import run_demo


@pytest.mark.parametrize("broker", ["memory", "kafka"])
async def test_demo_finishes_and_shows_acked_dead_lettered_and_redelivered(broker: str) -> None:
    out = io.StringIO()
    console = Console(file=out, width=140, force_terminal=False)
    assert await run_demo(24, console, broker) == 0
    text = out.getvalue()
    assert "acked ✓" in text
    assert "rejected → DLQ" in text
    assert "failed → redelivered" in text
    assert "2 in the DLQ" in text
    assert "'big-orders': 13, 'every-order': 22, 'audit': 23" in text  # duplicates dropped
    if broker == "kafka":
        assert "Kafka emulator" in text
