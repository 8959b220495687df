"""The Django project of the benchmark's `valka_worker`: Valka over REST and gRPC, like any
Django team's project (BENCH_VALKA_URL, BENCH_SERVER); its own database is not used."""

import os

SECRET_KEY = "the benchmark"
USE_TZ = True
INSTALLED_APPS = ["valka_sdk.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TASKS = {"default": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": [],
                     "OPTIONS": {"URL": os.environ.get("BENCH_VALKA_URL", "http://127.0.0.1:8989"),
                                 "DISPATCHER": os.environ.get("BENCH_SERVER", "127.0.0.1:50051")}}}
