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


valka_settings = ValkaSettings()
