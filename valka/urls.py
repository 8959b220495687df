"""The project's URLs: each app's own URL module, and the admin, schema and docs pages."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("", include("tasks.urls")),  # the overview (ahead of the admin, whose index it replaces), health, metrics
    path("admin/", admin.site.urls),
    path("api/v1/", include("tasks.api.urls")),
    path("api/v1/", include("signals.urls")),
    path("api/v1/", include("schedules.urls")),
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[AllowAny]),
         name="docs"),
]
