"""Settings of the django-tasks-db peer: its own database on the benchmark's PostgreSQL
(BENCH_DTDB_URL), the backend `django_tasks_db.DatabaseBackend`, one queue."""

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ.get("BENCH_DTDB_URL", "postgresql://localhost/dtdb"))

SECRET_KEY = "the benchmark"
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": _url.path.lstrip("/"),
                         "USER": _url.username or "", "PASSWORD": _url.password or "", "HOST": _url.hostname or "",
                         "PORT": _url.port or 5432}}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["django-drain", "enqueue"]}}
