"""The django-tasks-db peer's task: the same no-op `@task` as bench.django_jobs."""

from django.tasks import task


@task(queue_name="django-drain")
def noop():
    return None
