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


def refuse_development_key(process: str) -> str | None:
    """Why `process` (the web app, a dispatcher, a scheduler) must not start, or None.

    With DEBUG off and no SECRET_KEY of its own, a process would run with the public
    development key and plain-HTTP defaults: fine for the local stack and the tests, which
    say so (VALKA_DEVELOPMENT), and nowhere else."""
    if settings.DEBUG or settings.PRODUCTION or settings.VALKA.get("DEVELOPMENT"):
        return None
    return (f"{process}: SECRET_KEY is not set: set it (and ALLOWED_HOSTS) to run in production, "
            "or VALKA_DEVELOPMENT=true for a local stack")
