"""Who may call what: API keys (`Authorization: Bearer <key>`, stored as SHA-256 hashes, each
with a scope) and staff sessions (each with the model permissions the admin checks).

Keys carry 256 bits of randomness, so a fast hash is enough and lets every request be checked
with one indexed lookup. Every action of the API (REST, its event streams, gRPC's ApiService)
declares a `Need`: the permission a staff session must hold and the scope a key must have,
the same permission the admin requires for the same action.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from tasks.api.live_keys import LIVE_KEYS
from tasks.errors import Forbidden
from tasks.models import ApiKey
from tasks.prepared import fetchone_apart, fetchone_prepared
from tasks.sql import api_keys
from valka.conf import valka_settings

KEY_PREFIX = "vk_"
# The WSGI environ entry under which the web app's entry (valka.asgi) hands over the live key it
# found for the request's Authorization header, so that it is not looked up twice.
KEY_ENVIRON = "valka.api_key"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Need:
    """What an API action needs: a staff session must hold `permission`, an API key `scope`."""

    permission: str
    scope: str


READ_TASKS = Need("tasks.view_task", ApiKey.Scope.READ)
CREATE_TASKS = Need("tasks.add_task", ApiKey.Scope.WRITE)
CANCEL_TASKS = Need("tasks.cancel_task", ApiKey.Scope.WRITE)
DELETE_TASKS = Need("tasks.delete_task", ApiKey.Scope.ADMIN)
READ_DEAD_LETTERS = Need("tasks.view_deadletter", ApiKey.Scope.READ)
REPLAY_DEAD_LETTERS = Need("tasks.replay_deadletter", ApiKey.Scope.WRITE)
READ_WORKERS = Need("tasks.view_worker", ApiKey.Scope.READ)
READ_QUEUES = Need("tasks.view_queue", ApiKey.Scope.READ)
PAUSE_QUEUES = Need("tasks.pause_queue", ApiKey.Scope.WRITE)
CHANGE_QUEUES = Need("tasks.change_queue", ApiKey.Scope.ADMIN)


def api_key_create(*, name: str, scope: str = ApiKey.Scope.WRITE) -> tuple[ApiKey, str]:
    """Create a key; the plain key is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = ApiKey.objects.create(name=name, prefix=key[:10], key_hash=hash_key(key), scope=ApiKey.Scope(scope))
    return record, key


def api_key_live(key: str) -> ApiKey | None:
    """The unrevoked ApiKey whose hash is that of `key`, or None: remembered by a serving process
    (tasks.api.live_keys), or one unique-index look-up."""
    return LIVE_KEYS.get(hash_key(key), _read_live)


def api_key_live_apart(key: str) -> ApiKey | None:
    """`api_key_live`, read on a connection taken for it alone (tasks.prepared.fetchone_apart): valka.asgi's
    look-up, made before a request's body is read and its thread takes a connection of its own."""
    return LIVE_KEYS.get(hash_key(key), _read_live_apart)


def _read_live(key_hash: str) -> ApiKey | None:
    return _key_of(fetchone_prepared(api_keys.LIVE_KEY, [key_hash]))


def _read_live_apart(key_hash: str) -> ApiKey | None:
    return _key_of(fetchone_apart(api_keys.LIVE_KEY, [key_hash]))


def _key_of(row: tuple | None) -> ApiKey | None:
    return None if row is None else ApiKey.from_db(DEFAULT_DB_ALIAS, api_keys.KEY_FIELDS, row)


def bearer_key(authorization: str) -> str | None:
    """The key an `Authorization` value (`Bearer <key>`) carries, or None when it is not one: the
    one reading of the header for every way in (valka.asgi, the direct create, DRF, gRPC)."""
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def api_key_of(authorization: str) -> ApiKey | None:
    """The live key an `Authorization` value (`Bearer <key>`) names, or None (for gRPC's ApiService)."""
    key = bearer_key(authorization)
    return None if key is None else api_key_live(key)


def api_key_remembered(authorization: str) -> ApiKey | None:
    """The live key an `Authorization` value names if this process remembers it (tasks.api.live_keys),
    else None, without a look-up: for the REST create on the event loop, which must not wait on
    the database."""
    key = bearer_key(authorization)
    return None if key is None else LIVE_KEYS.remembered(hash_key(key))


USE_NOTED_EVERY = 60  # seconds: how often a key's last_used_at is written


def note_use(record: ApiKey) -> None:
    """Set the key's `last_used_at`, at most once a minute: a write on every request would cost
    each call a row lock on the key and an update."""
    now = timezone.now()
    if use_due(record, now):
        ApiKey.objects.filter(pk=record.pk).update(last_used_at=now)
        record.last_used_at = now  # a remembered key (tasks.api.live_keys) is not written again at once


def use_due(record: ApiKey, now: Any = None, *, margin: float = 0.0) -> bool:
    """Whether `note_use` would write the key's use at `now` (the present by default), or within
    `margin` seconds of it: a caller that notes it a moment later asks with a margin."""
    if record.last_used_at is None:
        return True
    return ((now or timezone.now()) - record.last_used_at).total_seconds() > USE_NOTED_EVERY - margin


def open_to_anonymous(sent_key: bool) -> bool:
    """Whether VALKA_API_ANONYMOUS lets this caller through unchecked: only one that sends no key.
    A key sent is held to its scope (and a wrong one refused) whatever the setting, in every way in
    (ApiAccess, the event streams, gRPC's ApiService)."""
    return valka_settings.API_ANONYMOUS and not sent_key


def check_key(key: ApiKey, need: Need) -> None:
    """Forbidden unless `key`'s scope covers `need`."""
    if not key.allows(need.scope):
        raise Forbidden(f"this API key's scope ({key.scope}) does not allow this: it needs {need.scope}",
                        {"scope": [f"needs {need.scope}"]})


def check_staff(user: Any, need: Need) -> None:
    """Forbidden unless staff `user` holds `need`'s permission (as the admin requires it)."""
    if not user.has_perm(need.permission):
        raise Forbidden(f"permission {need.permission} is needed for this", {"permission": [need.permission]})


class ApiKeyPrincipal:
    """The caller behind an API key (DRF wants a user-like object)."""

    is_authenticated = True
    is_staff = False

    def __init__(self, key: ApiKey) -> None:
        self.key = key

    def __str__(self) -> str:
        return f"api key {self.key.name}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[ApiKeyPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        key = bearer_key(header)
        if key is None:
            raise exceptions.AuthenticationFailed("invalid authorization header")
        record = request.META.get(KEY_ENVIRON) or api_key_live(key)
        if record is None:
            raise exceptions.AuthenticationFailed("invalid API key")
        note_use(record)
        return ApiKeyPrincipal(record), record

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """Documents the API key in the OpenAPI schema (as `ApiKey`, an HTTP bearer scheme)."""

    target_class = ApiKeyAuthentication
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: `Authorization: Bearer vk_...`"}


class ApiAccess(permissions.BasePermission):
    """An API key whose scope, or a staff session whose permissions, cover the view's `needs` for
    its action (an action that declares none is refused). VALKA_API_ANONYMOUS opens the API to
    callers without a key; a key sent is still held to its scope, as the README promises of every
    key. Refused: 401 without a credential, 403 (FORBIDDEN) with one that falls short."""

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if isinstance(user, ApiKeyPrincipal):
            key = user.key
        elif open_to_anonymous(sent_key=False):
            return True
        elif user is not None and user.is_authenticated and user.is_staff:
            key = None
        else:
            return False
        need = getattr(view, "needs", {}).get(getattr(view, "action", None))
        if need is None:
            raise Forbidden("this action is not open to API callers")
        if key is not None:
            check_key(key, need)
        else:
            check_staff(user, need)
        return True
