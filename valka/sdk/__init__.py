"""Valka's Python SDK: workers (`Worker`) and producers (`Client`, `AsyncClient`).

Imports nothing from Django, so worker programs stay small.
"""

from valka.sdk.client import AsyncClient, Client
from valka.sdk.context import Signal, TaskContext
from valka.sdk.errors import NonRetryableError, TaskCancelled, ValkaAPIError
from valka.sdk.worker import Worker

__all__ = [
    "AsyncClient", "Client", "NonRetryableError", "Signal", "TaskCancelled", "TaskContext", "ValkaAPIError",
    "Worker",
]
