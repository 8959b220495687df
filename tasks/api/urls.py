from django.urls import re_path

from tasks.api import stream, views

tasks = views.TaskViewSet
dead_letters = views.DeadLetterViewSet
queues = views.QueueViewSet
ID = r"(?P<pk>[^/]+)"

urlpatterns = [
    re_path(r"^tasks/?$", tasks.as_view({"get": "list", "post": "create"}), name="task-list"),
    re_path(r"^tasks/batch/?$", tasks.as_view({"post": "batch"}), name="task-batch"),
    re_path(rf"^tasks/{ID}/?$", tasks.as_view({"get": "retrieve", "delete": "destroy"}), name="task-detail"),
    re_path(rf"^tasks/{ID}/cancel/?$", tasks.as_view({"post": "cancel"}), name="task-cancel"),
    re_path(rf"^tasks/{ID}/runs/?$", tasks.as_view({"get": "runs"}), name="task-runs"),
    re_path(rf"^tasks/{ID}/runs/(?P<run_id>[^/]+)/logs/?$", tasks.as_view({"get": "logs"}), name="task-run-logs"),
    re_path(r"^dead-letters/?$", dead_letters.as_view({"get": "list"}), name="dead-letter-list"),
    re_path(rf"^dead-letters/{ID}/?$", dead_letters.as_view({"get": "retrieve"}), name="dead-letter-detail"),
    re_path(rf"^dead-letters/{ID}/replay/?$", dead_letters.as_view({"post": "replay"}), name="dead-letter-replay"),
    re_path(rf"^tasks/{ID}/runs/(?P<run_id>[^/]+)/logs/stream/?$", stream.logs, name="task-run-log-stream"),
    re_path(r"^events/?$", stream.events, name="events"),
    re_path(r"^workers/?$", views.WorkerViewSet.as_view({"get": "list"}), name="worker-list"),
    re_path(r"^queues/?$", queues.as_view({"get": "list"}), name="queue-list"),
    re_path(rf"^queues/{ID}/?$", queues.as_view({"get": "retrieve", "patch": "partial_update"}), name="queue-detail"),
    re_path(rf"^queues/{ID}/pause/?$", queues.as_view({"post": "pause"}), name="queue-pause"),
    re_path(rf"^queues/{ID}/resume/?$", queues.as_view({"post": "resume"}), name="queue-resume"),
]
