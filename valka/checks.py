"""Valka's own `manage.py check --deploy` checks: what a production install must not leave open.

Each warns only in production settings (`settings.PRODUCTION`: a SECRET_KEY of its own and DEBUG
off) and names the setting that fixes it. Registered by `tasks.apps.TasksConfig.ready()`.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks

from valka.conf import valka_settings


@checks.register(checks.Tags.security, deploy=True)
def check_worker_credential(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if not settings.PRODUCTION or valka_settings.WORKER_TOKEN or valka_settings.GRPC_TLS_CLIENT_CA:
        return []
    return [checks.Warning(
        "The dispatcher accepts workers without a credential: anyone who reaches its port can take tasks "
        "and their inputs, complete them, or close another worker's runs.",
        hint="Set VALKA_WORKER_TOKEN (workers send it: Worker(token=...)), or VALKA_GRPC_TLS_CLIENT_CA for "
             "mutual TLS (docs/security.md).",
        id="valka.W001",
    )]


@checks.register(checks.Tags.security, deploy=True)
def check_worker_port_encrypted(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if not settings.PRODUCTION or (valka_settings.GRPC_TLS_CERT and valka_settings.GRPC_TLS_KEY):
        return []
    return [checks.Warning(
        "The dispatcher's port is not encrypted: task inputs and outputs, API keys and the worker token "
        "cross the network in clear.",
        hint="Set VALKA_GRPC_TLS_CERT and VALKA_GRPC_TLS_KEY (PEM files) and connect workers with "
             "Worker(tls=...) (docs/security.md).",
        id="valka.W002",
    )]


@checks.register(checks.Tags.security, deploy=True)
def check_api_not_anonymous(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if not settings.PRODUCTION or not valka_settings.API_ANONYMOUS:
        return []
    return [checks.Warning(
        "Anonymous API calls are on: anyone who reaches the web app or the dispatcher's port can create, "
        "read and cancel tasks without an API key.",
        hint="Unset VALKA_API_ANONYMOUS (or set it to false) and create API keys with manage.py create_api_key.",
        id="valka.W003",
    )]
