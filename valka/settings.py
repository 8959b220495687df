"""Django settings for Valka. Every value comes from the environment (see README, "Settings")."""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
# A process given its own SECRET_KEY with DEBUG off is a production one: HTTPS-only defaults below.
# Without one, the settings serve the local stack and the tests (plain HTTP on loopback) with a
# development key that `check --deploy` flags.
_SECRET_KEY = env.str("SECRET_KEY", default="")
PRODUCTION = bool(_SECRET_KEY) and not DEBUG
SECRET_KEY = _SECRET_KEY or "django-insecure-valka-local-development-only"
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tasks",
    "signals",
    "schedules",
    "dispatcher",
]

MIDDLEWARE = [
    "valka.tracing.TraceContextMiddleware",  # a request's traceparent, for the tasks it creates
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "valka.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "valka.asgi.application"
WSGI_APPLICATION = "valka.wsgi.application"

DATABASES = {"default": env.db_url("DATABASE_URL", default="postgres://valka@127.0.0.1:55432/valka")}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise environ.ImproperlyConfigured("DATABASE_URL must point at PostgreSQL 15 or newer")
DATABASES["default"].setdefault("OPTIONS", {})
if env.bool("VALKA_DB_POOL", default=True):
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": env.int("VALKA_DB_POOL_MIN", default=1),
        "max_size": env.int("VALKA_DB_POOL_MAX", default=10),
        "timeout": env.float("VALKA_DB_POOL_TIMEOUT", default=10.0),
    }
# The producer's hot statements (one task's INSERT, the API key look-up) are prepared once per
# connection (tasks.prepared); the ORM's queries stay unprepared, as Django leaves them. Turn it
# off behind a pooler that cannot keep prepared statements (PgBouncer in transaction mode before
# 1.21, or without max_prepared_statements).
if env.bool("VALKA_DB_PREPARED_STATEMENTS", default=True):
    # A threshold no statement reaches by repetition: prepared only when asked with prepare=True.
    DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 2**31 - 1)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.str("STATIC_ROOT", default=None)
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").exists() else []
# Static files (admin, API docs) are served by the app itself, straight from the
# installed packages, so the pages work offline without a collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Security: each setting can be set from the environment; the defaults are secure in production
# (see PRODUCTION above), and cookies are HTTPS-only whenever DEBUG is off.
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=PRODUCTION)
# Probes and scrapers often speak plain HTTP inside the network: no redirect for them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=365 * 24 * 3600 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=PRODUCTION)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=PRODUCTION)
if env.bool("VALKA_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tasks.api.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tasks.api.auth.ApiAccess"],
    "DEFAULT_RENDERER_CLASSES": ["tasks.api.renderers.ValkaJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["tasks.api.parsers.ValkaJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "tasks.api.negotiation.ValkaContentNegotiation",
    "EXCEPTION_HANDLER": "tasks.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Valka API",
    "DESCRIPTION": "A distributed task queue whose only infrastructure is PostgreSQL.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "tasks.api.schema.postprocess"],
    "ENUM_NAME_OVERRIDES": {"SignalStatusEnum": "signals.models.SignalStatus",
                            "CatchUpEnum": "schedules.models.CatchUp"},
}

# The queue's own settings, read through `valka.conf.valka_settings`.
VALKA = {
    "API_ANONYMOUS": env.bool("VALKA_API_ANONYMOUS", default=False),
    # Threads per web process that run sync requests (valka.asgi); each holds a pooled
    # database connection while it works, so keep it under VALKA_DB_POOL_MAX.
    "WEB_THREADS": env.int("VALKA_WEB_THREADS", default=8),
    "MAX_RETRIES": env.int("VALKA_MAX_RETRIES", default=3),
    "DEFAULT_TIMEOUT_SECONDS": env.int("VALKA_DEFAULT_TIMEOUT_SECONDS", default=300),
    "RETRY_BASE_DELAY": env.float("VALKA_RETRY_BASE_DELAY", default=1.0),
    "RETRY_MAX_DELAY": env.float("VALKA_RETRY_MAX_DELAY", default=3600.0),
    "RETRY_JITTER": env.float("VALKA_RETRY_JITTER", default=0.25),
    "MAX_PAYLOAD_BYTES": env.int("VALKA_MAX_PAYLOAD_BYTES", default=1024 * 1024),
    "MAX_SIGNAL_PAYLOAD_BYTES": env.int("VALKA_MAX_SIGNAL_PAYLOAD_BYTES", default=64 * 1024),
    "SIGNAL_DELIVERY_WAIT": env.float("VALKA_SIGNAL_DELIVERY_WAIT", default=0.5),
    "GRPC_ADDR": env.str("VALKA_GRPC_ADDR", default="0.0.0.0:50051"),
    "WORKER_TOKEN": env.str("VALKA_WORKER_TOKEN", default=""),
    "NODE_ID": env.str("VALKA_NODE_ID", default=""),
    "LEASE_EXTENSION": env.float("VALKA_LEASE_EXTENSION", default=60.0),
    "HEARTBEAT_INTERVAL": env.float("VALKA_HEARTBEAT_INTERVAL", default=30.0),
    "DISPATCH_POLL_INTERVAL": env.float("VALKA_DISPATCH_POLL_INTERVAL", default=2.0),
    # How often a dispatcher re-reads cancels and signals for the runs its workers hold, in case a
    # notification was lost (seconds); also done whenever its LISTEN connection comes back.
    "DISPATCH_SWEEP_INTERVAL": env.float("VALKA_DISPATCH_SWEEP_INTERVAL", default=5.0),
    "DISPATCH_HOP_LOG": env.str("VALKA_DISPATCH_HOP_LOG", default=""),
    # Queues whose results free their worker's slot only once their ends are written, as under a
    # max_running at the workers' slots but with nothing counted: the bound `make bench` holds the
    # capped drain to (docs/queues.md). A measuring instrument, not a control: empty in production.
    "DISPATCH_HELD_QUEUES": env.list("VALKA_DISPATCH_HELD_QUEUES", default=[]),
    # A run's log is kept up to this many lines and bytes; the rest is dropped, and one line says how much.
    "RUN_LOG_MAX_LINES": env.int("VALKA_RUN_LOG_MAX_LINES", default=10_000),
    # What a dispatcher buffers for the database (results, logs) before it stops claiming and
    # stops reading from workers until the database has taken half of it.
    "DISPATCH_BUFFER_BYTES": env.int("VALKA_DISPATCH_BUFFER_BYTES", default=32 * 1024 * 1024),
    # The concurrency a worker may ask for in its hello; more is refused (INVALID_ARGUMENT).
    "MAX_WORKER_CONCURRENCY": env.int("VALKA_MAX_WORKER_CONCURRENCY", default=1_000),
    # TLS on the dispatcher's port: a certificate and its key (PEM files); with a client CA too,
    # mutual TLS: each worker presents a certificate that CA signed, which identifies it.
    "GRPC_TLS_CERT": env.str("VALKA_GRPC_TLS_CERT", default=""),
    "GRPC_TLS_KEY": env.str("VALKA_GRPC_TLS_KEY", default=""),
    "GRPC_TLS_CLIENT_CA": env.str("VALKA_GRPC_TLS_CLIENT_CA", default=""),
    # /metrics is open to anyone who reaches the web app; false: an API key or a staff session that
    # may see tasks.
    "METRICS_PUBLIC": env.bool("VALKA_METRICS_PUBLIC", default=True),
    # /metrics is computed at most once per this many seconds in each web process.
    "METRICS_CACHE_SECONDS": env.float("VALKA_METRICS_CACHE_SECONDS", default=10.0),
    # Event streams and live log tails one web process serves at once; past it, a 503.
    "MAX_STREAMS": env.int("VALKA_MAX_STREAMS", default=256),
    # A URL to PostgreSQL itself for the connections that need a session of their own (LISTEN, the
    # scheduler's leader lock, the dispatcher's pools), when DATABASE_URL goes through a pooler.
    "DIRECT_DATABASE_URL": env.str("VALKA_DIRECT_DATABASE_URL", default=""),
    # This process belongs to a local stack (make run, the tests): it may run with the development
    # SECRET_KEY. Without it (and with DEBUG off), the web app, dispatcher and scheduler refuse to.
    "DEVELOPMENT": env.bool("VALKA_DEVELOPMENT", default=False),
    "RUN_LOG_MAX_BYTES": env.int("VALKA_RUN_LOG_MAX_BYTES", default=10 * 1024 * 1024),
    # A stopping dispatcher is gone within this many seconds (SIGTERM to exit): it stops claiming,
    # hands its workers' running tasks over to the dispatcher they reconnect to, and writes what it
    # holds. Keep it under the orchestrator's grace period (Kubernetes: 30 s by default).
    "SHUTDOWN_TIMEOUT": env.float("VALKA_SHUTDOWN_TIMEOUT", default=25.0),
    "REAPER_INTERVAL": env.float("VALKA_REAPER_INTERVAL", default=30.0),
    "DISPATCHING_TIMEOUT": env.float("VALKA_DISPATCHING_TIMEOUT", default=60.0),
    "WORKER_TIMEOUT": env.float("VALKA_WORKER_TIMEOUT", default=120.0),
    "RETENTION_DAYS": env.float("VALKA_RETENTION_DAYS", default=7.0),
    "DEAD_LETTER_RETENTION_DAYS": env.float("VALKA_DEAD_LETTER_RETENTION_DAYS", default=30.0),
    "SCHEDULER_BATCH_SIZE": env.int("VALKA_SCHEDULER_BATCH_SIZE", default=500),
    # The retry engine and the delayed promoter wake at least this often (seconds), so a retry
    # or a scheduled task is picked up within about this long of its time.
    "SCHEDULER_MAX_SLEEP": env.float("VALKA_SCHEDULER_MAX_SLEEP", default=1.0),
    "RETENTION_INTERVAL": env.float("VALKA_RETENTION_INTERVAL", default=600.0),
    # The throughput counts that the tasks table's triggers append are added into their minutes at
    # least this often (seconds): between passes, /metrics and the overview read them appended.
    "COUNTER_FOLD_INTERVAL": env.float("VALKA_COUNTER_FOLD_INTERVAL", default=5.0),
    # Schedules declared in code (a list of dicts, each a schedule's fields): run_scheduler creates or
    # updates them by name at start (schedules.services.schedules_reconcile).
    "SCHEDULES": env.json("VALKA_SCHEDULES", default=[]),
    # A slot more than this many seconds late counts as missed: a schedule with catch_up "none" skips it.
    "SCHEDULE_MISFIRE_GRACE": env.float("VALKA_SCHEDULE_MISFIRE_GRACE", default=10.0),
    # The firing loop sleeps until the next slot, woken by a change to the schedules table; it
    # looks at the table at least this often in case a wake-up was lost.
    "SCHEDULE_POLL_INTERVAL": env.float("VALKA_SCHEDULE_POLL_INTERVAL", default=10.0),
}

# Bodies may carry `input` and `metadata` of MAX_PAYLOAD_BYTES each, so the request
# limit is raised to match; the API answers oversized fields with 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = VALKA["MAX_PAYLOAD_BYTES"] * 2 + 64 * 1024

# Django's task API on Valka, in process: `@task` functions of this project enqueue through
# `valka.enqueue`, in the caller's transaction (valka_sdk.django; no URL: in process). Any queue.
TASKS = {"default": {"BACKEND": "valka_sdk.django.ValkaBackend", "QUEUES": []}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("VALKA_LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
