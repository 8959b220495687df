"""The Django admin is Valka's console: an overview, tasks, dead letters, workers.

Machine-owned data is read-only here: no form can write `status` or any field
the dispatcher keeps. Every action (cancel, replay, create, and the signals
app's signal form) calls the same service function as the REST API, so it meets
the same state machine and the same validation, and each is gated by its own
permission: a refused POST is a 403, and CSRF is checked by `admin_view` as
everywhere in the admin. Pages read through indexed, bounded queries
(`tasks.dashboard`).

One module per model (tasks, queues, dead_letters, workers, api_keys), the base they
share (console), the list filters (filters) and the overview page (overview).
"""

from django.contrib import admin

from tasks.admin import api_keys, dead_letters, queues, tasks, workers  # noqa: F401  (they register their models)

admin.site.site_header = admin.site.site_title = "Valka"
admin.site.index_title = "Overview"
admin.site.enable_nav_sidebar = False  # the console's own navigation bar replaces it (templates/admin/base_site.html)
