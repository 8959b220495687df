from django.core.management.base import BaseCommand

from tasks.scheduler.runner import serve
from valka import aio


class Command(BaseCommand):
    help = "Run the scheduler (retries, lease reaper, delayed tasks, janitor, retention) until SIGTERM/SIGINT."

    def handle(self, *args, **options):
        # The pool, events and signal handlers are created inside the running event loop.
        aio.run(serve())
