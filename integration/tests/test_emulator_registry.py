"""Emulators found by entry point (``acklane.emulators``), each refused with what to
install while the extra its entry point names is not installed.

The "not installed" cases use a real distribution's metadata: a ``.dist-info`` written
to a directory put on ``sys.path``, registering an emulator whose extra needs a
distribution that does not exist (importlib.metadata reads it as any other).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acklane.core.cli import app as cli
from acklane.integration import emulator as registry
from acklane.integration.emulator import (
    EmulatorError,
    brokers,
    emulator_for,
    install_hint,
    missing_requirements,
)

OURS = ("kafka", "pubsub", "servicebus", "sqs")


@pytest.fixture
def fake_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A distribution ``acklane-fake`` registering emulator ``fake`` [extra ``fake``],
    which needs ``acklane-no-such-distribution`` (absent) and ``packaging`` (present)."""
    info = tmp_path / "acklane_fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: acklane-fake\n"
        "Version: 1.0\n"
        "Provides-Extra: fake\n"
        'Requires-Dist: acklane-no-such-distribution>=2; extra == "fake"\n'
        'Requires-Dist: packaging; extra == "fake"\n'
        "Requires-Dist: acklane-core\n"
    )
    (info / "entry_points.txt").write_text(
        "[acklane.emulators]\nfake = acklane_fake_emulator_module [fake]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake"


def test_acklanes_four_emulators_are_registered_by_entry_point() -> None:
    assert set(OURS) <= set(brokers())
    assert {b: registry.BROKERS[b] for b in OURS} == {b: f"acklane.integration.{b}" for b in OURS}


def test_with_every_extra_installed_no_emulator_lacks_anything() -> None:
    # (the dev environment installs acklane-integration[all]: moto[server]'s own extra too)
    assert {b: missing_requirements(b) for b in OURS} == {b: [] for b in OURS}


def test_the_install_hint_names_the_extra_of_the_broker() -> None:
    assert install_hint("kafka") == (
        'pip install "acklane-integration[kafka]" (with acklane: "acklane[kafka-testing]")'
    )


def test_an_emulator_whose_extra_is_missing_is_refused_naming_what_to_install(
    fake_broker: str,
) -> None:
    assert fake_broker in brokers()
    assert missing_requirements(fake_broker) == ["acklane-no-such-distribution>=2"]
    with pytest.raises(EmulatorError) as raised:
        emulator_for(fake_broker)  # refused before its module (which does not exist) loads
    assert str(raised.value) == (
        "the fake emulator needs acklane-no-such-distribution>=2, not installed: "
        'pip install "acklane-fake[fake]"'
    )


def test_the_emulator_list_shows_each_emulators_state(fake_broker: str) -> None:
    result = CliRunner().invoke(cli.app, ["emulator", "list"])
    assert result.exit_code == 0, result.output
    lines = dict(line.split("\t", 1) for line in result.stdout.splitlines())
    assert lines["kafka"].endswith("\tready")
    assert lines["fake"].endswith(
        '\tneeds acklane-no-such-distribution>=2: pip install "acklane-fake[fake]"'
    )


def test_starting_an_emulator_whose_extra_is_missing_says_what_to_install(
    fake_broker: str,
) -> None:
    result = CliRunner().invoke(cli.app, ["emulator", "start", fake_broker])
    assert result.exit_code == 1
    assert 'pip install "acklane-fake[fake]"' in result.stderr


def test_an_unknown_broker_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(EmulatorError, match=r"no emulator for broker 'nope' \(known: kafka"):
        emulator_for("nope")
