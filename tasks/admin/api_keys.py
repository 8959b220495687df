"""API keys in the console: listed, their scope changed and revoked here, created by
`manage.py create_api_key`."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from tasks.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "scope", "created_at", "last_used_at", "revoked"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    list_filter = ["revoked", "scope"]
    search_fields = ["name", "prefix"]

    def has_add_permission(self, request: Any) -> bool:
        return False  # keys are created with `manage.py create_api_key`, which shows the key once
