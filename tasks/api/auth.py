"""API keys: `Authorization: Bearer <key>`, stored as SHA-256 hashes.

Keys carry 256 bits of randomness, so a fast hash is enough and lets every
request be checked with one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from tasks.models import ApiKey
from tasks.prepared import fetchone_prepared
from tasks.sql import api_keys
from valka.conf import valka_settings

KEY_PREFIX = "vk_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_key_create(*, name: str) -> tuple[ApiKey, str]:
    """Create a key; the plain key is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    record = ApiKey.objects.create(name=name, prefix=key[:10], key_hash=hash_key(key))
    return record, key


def api_key_live(key: str) -> ApiKey | None:
    """The unrevoked ApiKey whose hash is that of `key`, or None (one unique-index look-up)."""
    row = fetchone_prepared(api_keys.LIVE_KEY, [hash_key(key)])
    return None if row is None else ApiKey.from_db(DEFAULT_DB_ALIAS, api_keys.KEY_FIELDS, row)


def api_key_valid(authorization: str) -> bool:
    """Whether an `Authorization` value (`Bearer <key>`) names a live key (for gRPC's ApiService)."""
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return False
    return api_key_live(key.strip()) is not None


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
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise exceptions.AuthenticationFailed("invalid authorization header")
        record = api_key_live(key.strip())
        if record is None:
            raise exceptions.AuthenticationFailed("invalid API key")
        now = timezone.now()
        if record.last_used_at is None or (now - record.last_used_at).total_seconds() > 60:
            ApiKey.objects.filter(pk=record.pk).update(last_used_at=now)
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
    """An API key or a staff session, unless VALKA_API_ANONYMOUS opens the API."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if valka_settings.API_ANONYMOUS:
            return True
        user = request.user
        if isinstance(user, ApiKeyPrincipal):
            return True
        return bool(user is not None and user.is_authenticated and user.is_staff)
