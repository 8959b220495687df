"""A Django project that is not Valka: Django's task API on Valka through `valka_sdk.django`.

Its own database is SQLite (SHOP_DB); Valka is reached over REST (VALKA_URL) and gRPC
(VALKA_DISPATCHER), as any Django team's project would. Used by tests/e2e/test_django_tasks.py.
"""

import os

SECRET_KEY = "a test project"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "valka_sdk.django", "tests.django_project.shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("SHOP_DB", ":memory:")}}
TASKS = {
    "default": {
        "BACKEND": "valka_sdk.django.ValkaBackend",
        "QUEUES": ["default", "shop", "ordered"],
        "OPTIONS": {"URL": os.environ.get("VALKA_URL", "http://127.0.0.1:8989"),
                    "DISPATCHER": os.environ.get("VALKA_DISPATCHER", "127.0.0.1:50051"), "RETRIES": 2},
    },
}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "root": {"handlers": ["console"], "level": "INFO"}}
