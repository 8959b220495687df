from django.core.management.base import BaseCommand, CommandError

from tasks.errors import ValkaError
from tasks.scheduler import extensions
from tasks.scheduler.runner import serve
from valka import tracing
from valka.conf import refuse_development_key
from valka.poolers import refuse_pooler
from valka_sdk import aio


class Command(BaseCommand):
    help = ("Run the scheduler (retries, lease reaper, delayed tasks, janitor, retention and the loops other apps "
            "add) until SIGTERM/SIGINT.")

    def handle(self, *args, **options):
        if (why := refuse_development_key("run_scheduler")) is not None:
            raise CommandError(why)
        tracing.configure("scheduler")  # a tracer provider, when the environment asks for one
        try:  # other apps' start-up work (tasks.scheduler.extensions), once the database answers
            extensions.run_on_start()
        except ValkaError as exc:
            raise CommandError(exc.message) from None

        # The pool, events and signal handlers are created inside the running event loop.
        async def main() -> None:
            if (why := await refuse_pooler("run_scheduler")) is not None:
                raise CommandError(why)
            await serve()

        aio.run(main())
