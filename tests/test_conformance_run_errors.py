"""``acklane run`` against a broker it cannot use: the same rules, the same test names, on
every connector that has a broker to lose (the memory broker lives inside the process).

Through ``acklane run`` as a user starts it, each broker's kit
(:mod:`acklane.integration.kits`) giving the stream block:

- a broker that does not answer is told once (not once per retry or client callback),
  the stream waits for it (no group failure, no traceback), and a stop is quick;
- credentials the broker refuses stop acklane: exit 1, one ERROR line naming the
  stream and the settings to check, the secret never printed, no traceback.

What only one broker has (Kafka's reconnect and dropped connections, each broker's
``validate --connect`` findings) is tested beside that broker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from acklane.integration.kits import BrokerKit, yaml_block
from acklane.integration.testing import AcklaneRun, write_pipeline

pytestmark = pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning")


def can(kit: BrokerKit, rule: str) -> None:
    why = kit.cannot.get(rule)
    if why is not None:
        pytest.skip(why)


async def test_an_unreachable_broker_is_told_once_and_the_stream_waits(
    tmp_path: Path, kit: BrokerKit
) -> None:
    can(kit, "unreachable")
    unusable = kit.unreachable(await kit.create())
    config = write_pipeline(tmp_path, kit.connector, yaml_block(unusable.fields))
    with AcklaneRun(config) as run:
        await asyncio.to_thread(run.wait_for, unusable.says)
        await asyncio.sleep(4)  # more tries meanwhile: none of them told again
        code = await asyncio.to_thread(run.stop)
    out = run.output
    assert code == 0, out
    assert out.count(unusable.says) == 1, out
    assert "Traceback" not in out
    assert "Restarting watchers" not in out  # waiting for a broker is no failure
    assert "did not close in time" not in out  # the stop did not wait for the broker


async def test_refused_credentials_stop_acklane_with_exit_1_and_one_line(
    tmp_path: Path, kit: BrokerKit
) -> None:
    can(kit, "refused")
    unusable = await kit.refused(await kit.create())
    config = write_pipeline(tmp_path, kit.connector, yaml_block(unusable.fields))
    with AcklaneRun(config) as run:
        code = await asyncio.to_thread(run.finish, 120)  # it stops by itself
    out, errors = run.output, run.errors
    assert code == 1, out
    assert len(errors) == 1, out
    [line] = errors
    assert "stream orders: " in line and unusable.says in line
    assert "streams.orders." in line  # the settings to check
    if unusable.secret:
        assert unusable.secret not in out
    assert "Traceback" not in out
    assert "Restarting watchers" not in out
