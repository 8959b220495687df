"""The REST API's schedule endpoints (included under /api/v1/ by valka/urls.py)."""

from django.urls import re_path

from schedules.views import ScheduleViewSet

NAME = r"(?P<name>[^/]+)"

urlpatterns = [
    re_path(r"^schedules/?$", ScheduleViewSet.as_view({"get": "list", "post": "create"}), name="schedule-list"),
    re_path(rf"^schedules/{NAME}/?$",
            ScheduleViewSet.as_view({"get": "retrieve", "patch": "partial_update", "delete": "destroy"}),
            name="schedule-detail"),
    re_path(rf"^schedules/{NAME}/trigger/?$", ScheduleViewSet.as_view({"post": "trigger"}),
            name="schedule-trigger"),
]
