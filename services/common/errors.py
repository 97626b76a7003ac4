"""Domain errors and their mapping to gRPC status codes with rich details.

Service code raises these; the server runtime turns them into a gRPC status whose message is readable
and whose details (grpc-status-details-bin, the standard rich error model) carry a greenserve.v1.ErrorDetail
plus, for bad fields, a google.rpc.BadRequest field violation any gRPC client library can decode.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from greenserve.v1 import common_pb2

# Error messages echo the caller's values (a name, a URL): a 100 KB value must not come back whole (it pushed a
# reply past the message limit). Every message is cut to MAX_ERROR_MESSAGE_CHARS and every field path to
# MAX_ERROR_FIELD_CHARS, keeping the head and the tail (the field and the reason) around a marker; `shown()`
# quotes one value cut to MAX_ECHO_CHARS. Documented in docs/security.md.
MAX_ERROR_MESSAGE_CHARS = 1024
MAX_ERROR_FIELD_CHARS = 256
MAX_ECHO_CHARS = 128


def truncate_middle(text: str, limit: int) -> str:
    """`text` when it has at most `limit` characters, else its head and tail around a "[N chars cut]" marker."""
    if len(text) <= limit:
        return text
    marker = f"...[{len(text) - limit} chars cut]..."
    keep = max(limit - len(marker), 2)
    head = keep - keep // 3
    return text[:head] + marker + text[len(text) - (keep - head):]


def shown(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """repr() of a value echoed in an error message, cut to `limit` characters (control characters escaped)."""
    return truncate_middle(repr(value), limit)


class GreenserveError(Exception):
    """Base of errors that map to a specific gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: common_pb2.ErrorReason = common_pb2.ERROR_REASON_UNSPECIFIED

    def __init__(self, message: str, *, field: str = "") -> None:
        message = truncate_middle(str(message), MAX_ERROR_MESSAGE_CHARS)
        field = truncate_middle(str(field), MAX_ERROR_FIELD_CHARS)
        super().__init__(message)
        self.message = message
        self.field = field

    def to_status(self, service: str = "") -> status_pb2.Status:
        """The google.rpc.Status this error is sent as."""
        status = status_pb2.Status(code=self.code.value[0], message=str(self))
        detail = common_pb2.ErrorDetail(reason=self.reason, field=self.field, message=self.message, service=service)
        status.details.add().Pack(detail)
        if self.field:
            bad_request = error_details_pb2.BadRequest(
                field_violations=[error_details_pb2.BadRequest.FieldViolation(field=self.field, description=self.message)]
            )
            status.details.add().Pack(bad_request)
        return status

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidArgument(GreenserveError):
    """A request field is invalid; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = common_pb2.ERROR_REASON_INVALID_FIELD

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


class NotFound(GreenserveError):
    """The named entity does not exist."""

    code = grpc.StatusCode.NOT_FOUND
    reason = common_pb2.ERROR_REASON_NOT_FOUND


class FailedPrecondition(GreenserveError):
    """The system is not in a state that allows the call."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = common_pb2.ERROR_REASON_FAILED_PRECONDITION


class Unavailable(GreenserveError):
    """A dependency is unreachable."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = common_pb2.ERROR_REASON_DEPENDENCY_UNAVAILABLE


class ResourceExhausted(GreenserveError):
    """A configured limit is reached."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = common_pb2.ERROR_REASON_RESOURCE_EXHAUSTED


def error_detail_from_rpc_error(error: grpc.RpcError) -> common_pb2.ErrorDetail | None:
    """The greenserve ErrorDetail carried by a failed call, if any (client side)."""
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)
    if status is None:
        return None
    for any_detail in status.details:
        if any_detail.Is(common_pb2.ErrorDetail.DESCRIPTOR):
            detail = common_pb2.ErrorDetail()
            any_detail.Unpack(detail)
            return detail
    return None

