"""The benchmark's `@task` functions for Django's task API (`bench.django_tasks`).

Their backend is the settings' "default": Valka's in-process backend in the benchmark's own
process (valka.settings), the remote one in the `valka_worker` it starts (bench.django_project).
"""

from django.tasks import task


@task(queue_name="django-drain")
def noop():
    return None
