"""Django's task API (`django.tasks`) on Valka: the backend `ValkaBackend`, the `@task` options
of `ValkaTask`, and the worker command `manage.py valka_worker` (docs/django.md).

    INSTALLED_APPS = [..., "valka_sdk.django"]
    TASKS = {"default": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": ["default", "emails"],
                         "OPTIONS": {"URL": "http://valka.internal:8989", "API_KEY": env("VALKA_API_KEY"),
                                     "DISPATCHER": "valka.internal:50051"}}}

Importing this package imports no Django: its names load on first use, so settings can name it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ValkaBackend", "ValkaTask", "ValkaTaskContext"]


def __getattr__(name: str) -> Any:
    if name in ("ValkaBackend", "ValkaTask"):
        from valka_sdk.django import backend

        return getattr(backend, name)
    if name == "ValkaTaskContext":
        from valka_sdk.django.runner import ValkaTaskContext

        return ValkaTaskContext
    raise AttributeError(name)
