"""ASGI entry point: `uvicorn valka.asgi:application`."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "valka.settings")

application = get_asgi_application()
