"""The REST API's signal endpoints (included under /api/v1/ by valka/urls.py)."""

from django.urls import re_path

from signals.views import SignalViewSet
from tasks.api.urls import ID

urlpatterns = [
    re_path(rf"^tasks/{ID}/signal/?$", SignalViewSet.as_view({"post": "send"}), name="task-signal"),
    re_path(rf"^tasks/{ID}/signals/?$", SignalViewSet.as_view({"get": "for_task"}), name="task-signals"),
    re_path(rf"^signals/{ID}/?$", SignalViewSet.as_view({"get": "retrieve"}), name="signal-detail"),
]
