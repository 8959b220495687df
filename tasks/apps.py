from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The project's own system checks (manage.py check --deploy); `valka` is not an app.
        from valka import checks  # noqa: F401
