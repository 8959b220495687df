import functools

from django.core.management.base import BaseCommand, CommandError

from dispatcher.server import Dispatcher
from tasks.api.live_keys import LIVE_KEYS
from valka import tracing
from valka.conf import refuse_development_key, valka_settings
from valka.db import conninfo
from valka.poolers import refuse_pooler
from valka_sdk import aio


class Command(BaseCommand):
    help = "Serve the valka.v1 gRPC protocol: push tasks to workers, record their results."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=None, help="listen address (default: VALKA_GRPC_ADDR, 0.0.0.0:50051)")

    def handle(self, *args, addr=None, **options):
        if (why := refuse_development_key("run_dispatcher")) is not None:
            raise CommandError(why)
        tracing.configure("dispatcher")  # a tracer provider, when the environment asks for one

        async def main() -> None:
            if (why := await refuse_pooler("run_dispatcher")) is not None:
                raise CommandError(why)
            # ApiService's callers' keys, remembered while the dispatcher serves (tasks.api.live_keys).
            LIVE_KEYS.start(functools.partial(conninfo, application_name="valka-dispatcher api keys", direct=True))
            await Dispatcher(addr or valka_settings.GRPC_ADDR).serve_forever()

        aio.run(main())
