"""The service layer's errors: each carries a stable code and an HTTP status.

REST maps them once (`tasks.api.errors`), gRPC once (`dispatcher.errors`).
"""

from typing import Any


class ValkaError(Exception):
    code = "ERROR"
    http_status = 500

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class ValidationError(ValkaError):
    code = "VALIDATION_ERROR"
    http_status = 400

    @classmethod
    def field(cls, name: str, problem: str) -> "ValidationError":
        return cls(f"{name}: {problem}", {name: [problem]})


class PayloadTooLarge(ValkaError):
    code = "PAYLOAD_TOO_LARGE"
    http_status = 413


class NotFound(ValkaError):
    code = "NOT_FOUND"
    http_status = 404


class InvalidState(ValkaError):
    """An illegal state transition, or an action the current state does not allow."""

    code = "INVALID_STATE"
    http_status = 409


class Unauthorized(ValkaError):
    code = "UNAUTHORIZED"
    http_status = 401


class Forbidden(ValkaError):
    """The caller is known, but may not do this (a staff user's permission, an API key's scope)."""

    code = "FORBIDDEN"
    http_status = 403
