"""`@task` functions of Valka's own project (its settings' in-process backend) for
tests/sdk/test_django_backend.py."""

from django.tasks import task


@task(queue_name="emails", priority=7, max_retries=1, timeout_seconds=30, metadata={"m": 1})
def send_receipt(order_id):
    return order_id


@task
async def async_receipt(order_id):
    return order_id


@task
def count_tasks():
    """Whether a connection was open when it started, and a query (which opens one)."""
    from django.db import connection

    from tasks.models import Task

    open_at_start = connection.connection is not None
    return {"open_at_start": open_at_start, "tasks": Task.objects.count()}
