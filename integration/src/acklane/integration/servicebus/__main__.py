"""``python -m acklane.integration.servicebus --port P --config F``: run the emulator."""

from __future__ import annotations

import argparse
import logging
import os

from ._config import EmulatorConfig
from ._sas import DEFAULT_KEY, DEFAULT_KEY_NAME
from ._serve import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m acklane.integration.servicebus",
        description="acklane's Azure Service Bus emulator (AMQP 1.0, no TLS).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--config", help="a Config.json like Microsoft's emulator's")
    parser.add_argument("--admin-port", type=int, help="HTTP admin endpoint (tests)")
    parser.add_argument("--key-name", default=DEFAULT_KEY_NAME)
    parser.add_argument(
        "--key",
        default=os.environ.get("ACKLANE_SERVICEBUS_KEY", DEFAULT_KEY),
        help="the shared access key tokens must be signed with ($ACKLANE_SERVICEBUS_KEY)",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    config = EmulatorConfig.load(args.config) if args.config else EmulatorConfig()
    serve(
        config,
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        key_name=args.key_name,
        key=args.key,
    )


if __name__ == "__main__":
    main()
