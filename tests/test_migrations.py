"""Every app's models match its migrations: nothing is left for `makemigrations` to write; and the
migrations do not go back past the tables that the database code of today uses."""

import os
import subprocess
import sys

import psycopg
import pytest
from django.core.management import call_command

from tests.helpers import ROOT


@pytest.mark.django_db
def test_migrations_match_models():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_unapplying_the_counts_table_is_refused_and_changes_nothing(own_cluster):
    back = subprocess.run([sys.executable, "manage.py", "migrate", "tasks", "0022"], cwd=ROOT, timeout=120,
                          capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": own_cluster.url, "VALKA_DB_POOL": "false"})
    assert back.returncode != 0
    assert "tasks.0023_counts_appended cannot be unapplied" in back.stderr
    with psycopg.connect(own_cluster.url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('task_counter_deltas')").fetchone() == ("task_counter_deltas",)
        assert conn.execute("SELECT count(*) FROM django_migrations WHERE app = 'tasks' AND name = %s",
                            ("0023_counts_appended",)).fetchone() == (1,)
