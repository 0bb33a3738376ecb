"""What the emulator answers a call it refuses: a gRPC status code and message, and
for exactly-once acknowledgements the per-ack-id failures Pub/Sub reports.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

__all__ = ["_Abort", "_AckIdFailure", "_invalid", "_not_found", "_unimplemented"]


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _Abort:
    return _Abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def _not_found(kind: str, name: str) -> _Abort:
    return _Abort(grpc.StatusCode.NOT_FOUND, f"Resource not found ({kind}={name}).")


def _unimplemented(feature: str) -> _Abort:
    """A feature of the service this emulator does not model: refused, never ignored."""
    return _Abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"acklane's Pub/Sub emulator does not implement {feature}; it refuses it rather "
        "than accept it and act differently from the service",
    )


class _AckIdFailure(_Abort):
    """Exactly-once delivery: some ack ids were invalid (expired, unknown or acked)."""

    def __init__(self, failures: dict[str, str]) -> None:
        super().__init__(
            grpc.StatusCode.INVALID_ARGUMENT,
            "Some acknowledgement ids in the request were invalid. This could be because "
            "the acknowledgement ids have expired or the acknowledgement ids were malformed.",
        )
        self.failures = failures

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        info = error_details_pb2.ErrorInfo(
            reason="EXACTLY_ONCE_ACKID_FAILURE",
            domain="pubsub.googleapis.com",
            metadata=self.failures,
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(
            code=code_pb2.INVALID_ARGUMENT, message=self.message, details=[detail]
        )
        return (("grpc-status-details-bin", status.SerializeToString()),)
