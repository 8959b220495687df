"""The pages of the tasks app outside the REST API: the console's overview, health and metrics."""

from django.contrib import admin
from django.urls import path

from tasks.admin.overview import overview_view
from tasks.api.views import healthz
from tasks.metrics import metrics_view

urlpatterns = [
    # The admin index with the queue overview; included ahead of admin.site.urls so it wins for /admin/.
    path("admin/", admin.site.admin_view(overview_view), name="valka-overview"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
]
