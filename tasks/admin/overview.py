"""The console's front page: the admin index with the queue overview on top."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from tasks import dashboard


def overview_view(request: HttpRequest) -> HttpResponse:
    """Routed in tasks/urls.py ahead of the admin's own index, which it wraps."""
    context = {"overview": dashboard.overview()} if request.user.has_perm("tasks.view_task") else {}
    return admin.site.index(request, extra_context=context)
