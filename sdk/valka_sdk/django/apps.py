from django.apps import AppConfig


class ValkaSdkConfig(AppConfig):
    """Brings `manage.py valka_worker`; the backend works without the app installed."""

    name = "valka_sdk.django"
    label = "valka_sdk"
    verbose_name = "Valka (Django tasks)"
