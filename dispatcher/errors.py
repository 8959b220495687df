"""The service layer's errors as gRPC statuses: mapped here, once."""

from __future__ import annotations

import grpc

from tasks.errors import Forbidden, InvalidState, NotFound, PayloadTooLarge, Unauthorized, ValidationError, ValkaError

STATUS_CODES: dict[type[ValkaError], grpc.StatusCode] = {
    ValidationError: grpc.StatusCode.INVALID_ARGUMENT,
    PayloadTooLarge: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    InvalidState: grpc.StatusCode.FAILED_PRECONDITION,
    Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
    Forbidden: grpc.StatusCode.PERMISSION_DENIED,
}


def grpc_status(exc: ValkaError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL


def grpc_message(exc: ValkaError) -> str:
    return f"{exc.code}: {exc.message}"
