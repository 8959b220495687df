from django.core.management.base import BaseCommand

from tasks.api.auth import api_key_create


class Command(BaseCommand):
    help = "Create an API key. The key is printed once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("name", help="What the key is for, e.g. 'billing-service'.")

    def handle(self, *args, name: str, **options):
        record, key = api_key_create(name=name)
        self.stdout.write(f"Created API key {record.name!r} (prefix {record.prefix}). Send it as "
                          "'Authorization: Bearer <key>'; it is not shown again:")
        self.stdout.write(key)
