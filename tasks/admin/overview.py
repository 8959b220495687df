"""The console's front page: the admin index with the queue overview on top.

Other apps add panels of their own from their `AppConfig.ready()` (tasks imports none of
them): each entry of `PANELS` takes the request and answers its template's context, with the
template under "template", or None when it has nothing to show this user.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from tasks import dashboard

Panel = Callable[[HttpRequest], dict[str, Any] | None]
PANELS: list[Panel] = []


def add_panel(panel: Panel) -> None:
    """Register `panel` once (an app's `ready()` may run more than once in tests)."""
    if panel not in PANELS:
        PANELS.append(panel)


def overview_view(request: HttpRequest) -> HttpResponse:
    """Routed in tasks/urls.py ahead of the admin's own index, which it wraps."""
    context: dict[str, Any] = {"overview": dashboard.overview()} if request.user.has_perm("tasks.view_task") else {}
    context["panels"] = [shown for shown in (panel(request) for panel in PANELS) if shown]
    return admin.site.index(request, extra_context=context)
