from django.apps import AppConfig


class SignalsConfig(AppConfig):
    name = "signals"
    label = "signals"
    verbose_name = "Signals"
    default_auto_field = "django.db.models.BigAutoField"
