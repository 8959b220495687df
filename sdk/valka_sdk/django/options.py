"""The backend's `OPTIONS`, read once and checked: what is wrong becomes a system check error
(`manage.py check`, and every command that runs the checks) and an `ImproperlyConfigured` at the
first enqueue, never a task sent to the wrong place.

Every option, with its default, is in docs/django.md ("Settings").
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from valka_sdk.limits import QUEUE_RE, QUEUE_RULE

KNOWN = {"URL", "API_KEY", "TIMEOUT", "RETRIES", "ON_COMMIT", "ON_COMMIT_ROBUST", "DATABASE", "DISPATCHER",
         "WORKER_TOKEN", "TLS", "TLS_CA_FILE", "TLS_CERT_FILE", "TLS_KEY_FILE"}


@dataclass(frozen=True)
class Options:
    url: str | None
    api_key: str | None
    timeout: float
    retries: int
    on_commit: bool
    on_commit_robust: bool
    database: str
    dispatcher: str | None
    worker_token: str | None
    tls: bool
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    # (check id, message, hint) for each thing wrong; empty when all is well.
    problems: list[tuple[str, str, str]] = field(default_factory=list)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read(alias: str, options: dict[str, Any], queues: set[str], *, in_project: bool) -> Options:
    """`OPTIONS` of the backend `alias`, with the problems found (ids `valka_sdk.E00N`)."""
    problems: list[tuple[str, str, str]] = []
    where = f"TASKS[{alias!r}]"
    for key in sorted(set(options) - KNOWN):
        problems.append(("valka_sdk.E001", f"{where}['OPTIONS'] has an unknown option {key!r}.",
                         f"Known options: {', '.join(sorted(KNOWN))}."))
    url = options.get("URL") or None
    api_key = options.get("API_KEY") or None
    if url is None:
        if not in_project:
            problems.append(("valka_sdk.E002", f"{where}['OPTIONS'] has no 'URL', and this is not Valka's own project.",
                             "Set 'URL' to Valka's web app, e.g. 'http://valka.internal:8989'."))
    else:
        parts = urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(("valka_sdk.E003", f"{where}['OPTIONS']['URL'] must be an http(s) URL, not {url!r}.",
                             "e.g. 'http://valka.internal:8989'"))
        elif api_key is None and not _loopback(parts.hostname):
            problems.append(("valka_sdk.E004", f"{where}['OPTIONS'] has no 'API_KEY' for {url}.",
                             "Create one with `manage.py create_api_key NAME` on the Valka server (scope write)."))
    for queue in sorted(queues, key=str):
        if not isinstance(queue, str) or not QUEUE_RE.match(queue):
            problems.append(("valka_sdk.E005", f"{where}['QUEUES'] has an invalid queue {queue!r}.",
                             f"A queue's name {QUEUE_RULE}."))
    tls_files = {name: options.get(name) or None for name in ("TLS_CA_FILE", "TLS_CERT_FILE", "TLS_KEY_FILE")}
    for name, path in tls_files.items():
        if path is not None and not Path(path).is_file():
            problems.append(("valka_sdk.E006", f"{where}['OPTIONS'][{name!r}] is not a file: {path}.", ""))
    if bool(tls_files["TLS_CERT_FILE"]) != bool(tls_files["TLS_KEY_FILE"]):
        problems.append(("valka_sdk.E007", f"{where}['OPTIONS'] needs both 'TLS_CERT_FILE' and 'TLS_KEY_FILE'.",
                         "Mutual TLS takes the worker's certificate and its key."))

    def number(name: str, default: float, kind: type) -> Any:
        value = options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < (0 if kind is int else 0.001):
            problems.append(("valka_sdk.E008", f"{where}['OPTIONS'][{name!r}] must be a positive number.", ""))
            return default
        return kind(value)

    return Options(
        url=str(url).rstrip("/") if url else None, api_key=api_key, timeout=number("TIMEOUT", 10.0, float),
        retries=max(1, number("RETRIES", 3, int)), on_commit=bool(options.get("ON_COMMIT", True)),
        on_commit_robust=bool(options.get("ON_COMMIT_ROBUST", False)), database=options.get("DATABASE", "default"),
        dispatcher=options.get("DISPATCHER") or None,
        worker_token=options.get("WORKER_TOKEN") or os.environ.get("VALKA_WORKER_TOKEN") or None,
        tls=bool(options.get("TLS", False)), tls_ca_file=tls_files["TLS_CA_FILE"],
        tls_cert_file=tls_files["TLS_CERT_FILE"], tls_key_file=tls_files["TLS_KEY_FILE"], problems=problems,
    )
