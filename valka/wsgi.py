"""WSGI entry point (`gunicorn valka.wsgi`, `manage.py runserver`); `valka.asgi` is the one the
README documents. Like it, it refuses to start on the development SECRET_KEY outside a local stack."""

import os
import sys

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "valka.settings")

application = get_wsgi_application()

from valka.conf import refuse_development_key  # noqa: E402

if (_refused := refuse_development_key("web")) is not None:
    print(_refused, file=sys.stderr)
    raise SystemExit(1)
