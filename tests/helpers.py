"""Small helpers shared by the tests."""

from django.db import connection


def database_url() -> str:
    """A libpq URL for the database the test run uses (the test database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgresql://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"
