"""Exceptions a handler raises, the client's API error, and how a failure travels in `error_message`.

`valka.v1`'s `TaskResult` has one text for a failure, `error_message` (at most MAX_ERROR
characters). This SDK writes it as a summary line, then, for an exception the handler raised,
the exception's class path and its traceback after a marker line:

    RuntimeError: card declined                       <- the summary: one line, what the admin lists
                                                      <- a blank line
    --- exception: payments.errors.CardDeclined       <- MARK, then the class's module and qualified name
    Traceback (most recent call last):                <- the traceback as Python prints it
      File "payments/tasks.py", line 12, in charge
    payments.errors.CardDeclined: card declined

A text without the marker (another SDK's, or the server's own: `lease expired`, `worker
disconnected`) is a summary alone. Any SDK may write the marker; `parse_failure` reads it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

MAX_ERROR = 64 * 1024  # characters of an error message; the dispatcher cuts longer ones
MARK = "\n\n--- exception: "


class NonRetryableError(Exception):
    """Raise from a handler to fail the task for good (FAILED, no retry).

    Any other exception is a retryable failure: the task is retried with
    backoff until its retries run out, then dead-lettered.
    """


class TaskCancelled(Exception):
    """Raised inside sync handlers by `ctx.raise_if_cancelled()` once the task is cancelled (and, with
    `Worker(interrupt_sync_handlers=True)`, into the handler's thread)."""


class ValkaAPIError(Exception):
    """An error answer from the REST API, with its stable code."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


class ValkaUnavailable(ConnectionError):
    """Valka's API could not be reached (after the tries a caller allowed); the message names its URL."""


class RunFailed(Exception):
    """Stands for a failed run whose `error_message` names no exception class (another SDK's, or one
    the server wrote), where a class path is wanted (Django's `TaskError`)."""


class RunLost(RunFailed):
    """Stands for a run the server closed LOST: its lease expired, or its worker went away."""


@dataclass(frozen=True)
class Failure:
    """A run's `error_message`, read: the summary, and the exception's class path and traceback
    when the worker sent them (else None)."""

    summary: str
    exception_class_path: str | None = None
    traceback: str | None = None


def class_path(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def format_failure(summary: str, exc: BaseException | None = None, limit: int = MAX_ERROR) -> str:
    """The `error_message` for a failed run: `summary` (its first line), and `exc`'s class path and
    traceback when given. Within `limit` characters: a long traceback loses its oldest frames
    first (the last lines say what was raised, where)."""
    if exc is None:
        return summary[:limit]
    lines = summary.splitlines()
    head = (lines[0] if lines else "")[: limit // 4]
    marker = f"{head}{MARK}{class_path(exc)}\n"
    text = "".join(traceback.format_exception(exc))
    room = limit - len(marker)
    if room <= 0:
        return head
    if len(text) > room:
        text = "…\n" + text[len(text) - room + 2:]
    return marker + text


def parse_failure(message: str | None) -> Failure:
    """Read an `error_message` written by `format_failure` (or by anyone else: then a summary alone)."""
    message = message or ""
    at = message.find(MARK)
    if at < 0 or "\n" in message[:at]:
        return Failure(summary=message)
    path, _, tb = message[at + len(MARK):].partition("\n")
    return Failure(summary=message[:at], exception_class_path=path.strip() or None, traceback=tb or None)
