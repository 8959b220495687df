from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    """Periodic tasks. The app extends `tasks` (which imports nothing of it) through the lists tasks
    keeps for that: a loop and a start-up step of the scheduler, a panel of the overview, a fact of
    a task's page, a collector of /metrics and the schema check's files."""

    name = "schedules"
    label = "schedules"
    verbose_name = "Schedules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from schedules import admin, firing, metrics, schema, services
        from tasks import metrics as task_metrics
        from tasks.admin import overview
        from tasks.admin import tasks as task_admin
        from tasks.scheduler import extensions
        from tasks.sql import schema as task_schema

        extensions.add_loop(firing.from_settings)
        extensions.add_on_start(services.schedules_reconcile)
        overview.add_panel(admin.next_due_panel)
        task_admin.add_detail_facts(admin.schedule_of_task)
        metrics.register(task_metrics.registry)
        if schema.FILES not in task_schema.OTHERS:
            task_schema.OTHERS.append(schema.FILES)
