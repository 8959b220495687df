"""Exceptions a handler raises, and the client's API error."""

from __future__ import annotations

from typing import Any


class NonRetryableError(Exception):
    """Raise from a handler to fail the task for good (FAILED, no retry).

    Any other exception is a retryable failure: the task is retried with
    backoff until its retries run out, then dead-lettered.
    """


class TaskCancelled(Exception):
    """Raised inside sync handlers by `ctx.raise_if_cancelled()` once the task is cancelled."""


class ValkaAPIError(Exception):
    """An error answer from the REST API, with its stable code."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
