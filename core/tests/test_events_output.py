"""``acklane events list`` piped to a file or a program: one line per event.

On a terminal the events are a table wrapped to its width; anywhere else (a file, a
pipe, ``| grep``) each event is one tab-separated line, whatever its length.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from acklane.core.events import EventRecord, EventStore

LONG = "a-watcher-with-a-rather-long-name-that-a-table-would-fold"


async def _fill(url: str) -> None:
    async with EventStore(url, on_confirmed=lambda seqs: None) as store:
        for n in range(3):
            payload = {"n": n, "text": "x" * 150, "tab": "a\tb"}
            record = EventRecord(LONG, '["memory","orders"]', payload, f"memory:m/{n}", n)
            await store.put(record, seq=n)
        await store.flush()


def test_piped_events_list_is_one_tab_separated_line_per_event(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    asyncio.run(_fill(url))

    out = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "events", "list", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
        check=True,
    ).stdout
    lines = out.splitlines()
    assert len(lines) == 4, out  # the header and one line per event
    assert lines[0].split("\t")[:3] == ["id", "created (UTC)", "trigger"]
    for n, line in enumerate(lines[1:]):
        cells = line.split("\t")
        assert len(cells) == 7, line
        assert cells[2] == LONG
        assert cells[4] == f"memory:m/{n}"
        assert '"x' in cells[6] and cells[6].endswith("}")
