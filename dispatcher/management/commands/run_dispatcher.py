from django.core.management.base import BaseCommand

from dispatcher.server import Dispatcher
from valka import aio
from valka.conf import valka_settings


class Command(BaseCommand):
    help = "Serve the valka.v1 gRPC protocol: push tasks to workers, record their results."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=None, help="listen address (default: VALKA_GRPC_ADDR, 0.0.0.0:50051)")

    def handle(self, *args, addr=None, **options):
        async def main() -> None:
            await Dispatcher(addr or valka_settings.GRPC_ADDR).serve_forever()

        aio.run(main())
