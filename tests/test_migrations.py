"""Every app's models match its migrations: nothing is left for `makemigrations` to write."""

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_migrations_match_models():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
