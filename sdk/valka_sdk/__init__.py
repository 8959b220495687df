"""Valka's Python SDK: workers (`Worker`) and producers (`Client`, `AsyncClient`).

The distribution `valka-sdk` (`sdk/` in Valka's repository): it imports nothing of the server,
and nothing from Django but in `valka_sdk.django`, the backend for Django's task API.
"""

from valka_sdk.client import AsyncClient, Client
from valka_sdk.context import Signal, TaskContext
from valka_sdk.errors import NonRetryableError, TaskCancelled, ValkaAPIError
from valka_sdk.worker import Worker

__all__ = [
    "AsyncClient", "Client", "NonRetryableError", "Signal", "TaskCancelled", "TaskContext", "ValkaAPIError",
    "Worker",
]
