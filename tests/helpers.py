"""Small helpers shared by the tests."""

import time

from django.db import connection


def database_url() -> str:
    """A libpq URL for the database the test run uses (the test database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgresql://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"


def no_event_watchers_left(timeout: float = 10.0) -> None:
    """Wait until no session watches task events: earlier tests' watchers are pruned once their
    sessions have ended, a moment after they close."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cur:
        while True:
            cur.execute("SELECT valka_task_event_watchers_prune()")
            cur.execute("SELECT count(*) FROM task_event_watchers")
            if cur.fetchone()[0] == 0:
                return
            assert time.monotonic() < deadline, "a task event watcher from an earlier test is still alive"
            time.sleep(0.05)
