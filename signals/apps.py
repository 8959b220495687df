from django.apps import AppConfig


class SignalsConfig(AppConfig):
    name = "signals"
    label = "signals"
    verbose_name = "Signals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from signals import sql
        from tasks.sql import outcomes

        # An attempt that ends in RETRY gives its unacknowledged signals back to the next attempt,
        # in the same transaction (tasks.sql.outcomes.retry_runs runs them).
        if sql.REDELIVER not in outcomes.ON_RETRY:
            outcomes.ON_RETRY.append(sql.REDELIVER)
