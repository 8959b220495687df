"""The queue's settings in one namespaced object: `valka_settings.MAX_RETRIES`.

Values come from `settings.VALKA` (filled from `VALKA_<NAME>` environment
variables); tests override them with Django's `override_settings`.
"""

from typing import Any

from django.conf import settings


class ValkaSettings:
    def __getattr__(self, name: str) -> Any:
        try:
            return settings.VALKA[name]
        except KeyError:
            raise AttributeError(f"unknown Valka setting {name!r}") from None

    def all(self) -> dict[str, Any]:
        """Every setting at once, for code that reads several in a hot loop."""
        return settings.VALKA


valka_settings = ValkaSettings()
