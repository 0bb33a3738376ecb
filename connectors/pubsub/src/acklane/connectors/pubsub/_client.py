"""The Pub/Sub clients of a stream: the emulator's plain channel, or Google's endpoint."""

from __future__ import annotations

from typing import Any, Literal

from ._config import PubSubConfig

__all__ = ["make_client"]


def make_client(config: PubSubConfig, kind: Literal["subscriber", "publisher"]) -> Any:
    """A ``SubscriberAsyncClient`` or ``PublisherAsyncClient`` reaching the stream's endpoint.

    ``emulator_host``: an insecure gRPC channel and no credentials. Otherwise
    ``endpoint`` and ``client_options``, with ``credentials_file`` or Application
    Default Credentials.
    """
    from google.api_core.client_options import ClientOptions

    if kind == "subscriber":
        from google.pubsub_v1 import SubscriberAsyncClient as client_class
        from google.pubsub_v1.services.subscriber.transports import (
            SubscriberGrpcAsyncIOTransport as transport_class,
        )
    else:
        from google.pubsub_v1 import PublisherAsyncClient as client_class  # type: ignore[assignment]
        from google.pubsub_v1.services.publisher.transports import (  # type: ignore[assignment]
            PublisherGrpcAsyncIOTransport as transport_class,
        )
    if config.emulator_host is not None:
        import grpc

        channel = grpc.aio.insecure_channel(config.emulator_host)
        return client_class(transport=transport_class(channel=channel))
    options = dict(config.client_options)
    if config.endpoint is not None:
        options["api_endpoint"] = config.endpoint
    credentials = None
    if config.credentials_file is not None:
        from google.oauth2 import service_account

        credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            config.credentials_file,
            scopes=["https://www.googleapis.com/auth/pubsub"],
        )
    return client_class(credentials=credentials, client_options=ClientOptions(**options))
