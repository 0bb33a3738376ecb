"""acklane's Azure Service Bus emulator (an AMQP 1.0 server on python-qpid-proton) and
its launchers: ``LOCAL`` (our server as a subprocess) and ``DOCKER`` (Microsoft's image).

Run it with ``python -m acklane.integration.servicebus --port P --config F`` or
``acklane emulator start servicebus``.
"""

from ._config import EmulatorConfig, EntityProperties, parse_duration
from ._launcher import (
    MicrosoftServiceBusEmulator,
    ServiceBusEmulator,
    ServiceBusKit,
    connection_string,
)
from ._sas import DEFAULT_KEY, DEFAULT_KEY_NAME, verify_sas_token
from ._server import ServiceBusServer

LOCAL = ServiceBusEmulator
DOCKER = MicrosoftServiceBusEmulator

__all__ = [
    "DEFAULT_KEY",
    "DEFAULT_KEY_NAME",
    "DOCKER",
    "LOCAL",
    "EmulatorConfig",
    "EntityProperties",
    "MicrosoftServiceBusEmulator",
    "ServiceBusEmulator",
    "ServiceBusKit",
    "ServiceBusServer",
    "connection_string",
    "parse_duration",
    "verify_sas_token",
]
