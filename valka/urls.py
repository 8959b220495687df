from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from tasks.admin import overview_view
from tasks.api.views import healthz
from tasks.metrics import metrics_view

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    # The admin index with the queue overview; ahead of admin.site.urls so it wins for /admin/.
    path("admin/", admin.site.admin_view(overview_view), name="valka-overview"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include("tasks.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[AllowAny]),
         name="docs"),
]
