from django.core.management.base import BaseCommand

from tasks.api.auth import api_key_create
from tasks.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key. The key is printed once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("name", help="What the key is for, e.g. 'billing-service'.")
        parser.add_argument("--scope", choices=ApiKey.Scope.values, default=ApiKey.Scope.WRITE,
                            help="read: reads only; write (default): and create, cancel, replay, signal, "
                                 "pause queues, change schedules; admin: and delete tasks and schedules, "
                                 "change queues' limits.")

    def handle(self, *args, name: str, scope: str, **options):
        record, key = api_key_create(name=name, scope=scope)
        self.stdout.write(f"Created API key {record.name!r} (prefix {record.prefix}, scope {record.scope}). Send it as "
                          "'Authorization: Bearer <key>'; it is not shown again:")
        self.stdout.write(key)
