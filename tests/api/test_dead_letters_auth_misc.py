import uuid

import pytest
from django.core.management import call_command

from tasks.models import DeadLetter, Task
from tests.api.test_tasks_api import assert_error
from tests.factories import DeadLetterFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def test_dead_letter_list_detail_and_filter(client_api):
    a = DeadLetterFactory(queue="a")
    DeadLetterFactory(queue="b")
    body = client_api.get("/api/v1/dead-letters").json()
    assert body["count"] == 2
    assert client_api.get("/api/v1/dead-letters", {"queue": "a"}).json()["results"][0]["id"] == str(a.id)
    detail = client_api.get(f"/api/v1/dead-letters/{a.id}").json()
    assert detail["error_message"] == "boom" and detail["attempt_count"] == 4
    assert detail["task_id"] == str(a.task_id)
    assert_error(client_api.get(f"/api/v1/dead-letters/{uuid.uuid4()}"), 404, "NOT_FOUND")


def test_replay_creates_a_linked_pending_task(client_api):
    letter = DeadLetterFactory(metadata={"tenant": 3}, input={"x": 1})
    r = client_api.post(f"/api/v1/dead-letters/{letter.id}/replay")
    assert r.status_code == 201, r.content
    new = r.json()
    assert new["status"] == "PENDING" and new["id"] != str(letter.task_id)
    assert (new["task_name"], new["queue"], new["input"], new["metadata"]) == (
        letter.task_name, letter.queue, {"x": 1}, {"tenant": 3})
    assert new["replayed_from_dead_letter_id"] == str(letter.id)
    assert new["replayed_from_task_id"] == str(letter.task_id)
    shown = client_api.get(f"/api/v1/dead-letters/{letter.id}").json()
    assert shown["replay_task_id"] == new["id"] and shown["replayed_at"] and shown["replay_count"] == 1
    assert_error(client_api.post(f"/api/v1/dead-letters/{uuid.uuid4()}/replay"), 404, "NOT_FOUND")


def test_workers_list(client_api):
    WorkerFactory(id="w-1", queues=["a", "b"])
    body = client_api.get("/api/v1/workers").json()
    assert body["count"] == 1 and body["results"][0]["worker_id"] == "w-1"
    assert body["results"][0]["queues"] == ["a", "b"]


def test_auth_required_by_default(anon_client):
    for method, url in [("get", "/api/v1/tasks"), ("post", "/api/v1/tasks"), ("get", "/api/v1/dead-letters"),
                        ("get", "/api/v1/workers")]:
        r = getattr(anon_client, method)(url, {"task_name": "t", "queue": "q"}, format="json")
        assert_error(r, 401, "UNAUTHORIZED")
    assert Task.objects.count() == 0


def test_wrong_key_is_401_and_leaks_nothing(anon_client, api_key):
    anon_client.credentials(HTTP_AUTHORIZATION="Bearer vk_wrong")
    r = anon_client.get("/api/v1/tasks")
    assert_error(r, 401, "UNAUTHORIZED")
    assert "vk_" not in r.content.decode().replace("vk_wrong", "")


def test_keys_are_stored_hashed(api_key):
    from tasks.models import ApiKey

    record = ApiKey.objects.get()
    assert api_key not in (record.key_hash, record.prefix) and len(record.key_hash) == 64


def test_anonymous_mode(anon_client, settings):
    settings.VALKA = {**settings.VALKA, "API_ANONYMOUS": True}
    assert anon_client.get("/api/v1/tasks").status_code == 200


def test_staff_session_works(anon_client, django_user_model):
    user = django_user_model.objects.create_user("ops", password="pw-123456", is_staff=True)
    anon_client.force_login(user)
    assert anon_client.get("/api/v1/tasks").status_code == 200
    plain = django_user_model.objects.create_user("plain", password="pw-123456")
    anon_client.force_login(plain)
    assert anon_client.get("/api/v1/tasks").status_code in (401, 403)


def test_create_api_key_command_prints_key_last(capsys, anon_client):
    call_command("create_api_key", "ci")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    anon_client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert anon_client.get("/api/v1/tasks").status_code == 200


def test_healthz_is_public(anon_client):
    r = anon_client.get("/healthz")
    assert r.status_code == 200 and r.json()["database"] == "ok"


def test_schema_and_docs(anon_client):
    schema = anon_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert "/api/v1/tasks" in schema.content.decode()
    docs = anon_client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_migrations_match_models():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_admin_requires_login(anon_client):
    r = anon_client.get("/admin/")
    assert r.status_code == 302 and "/admin/login/" in r["Location"]


def test_admin_pages_render_read_only(anon_client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-123456")
    anon_client.force_login(admin)
    letter = DeadLetterFactory()
    for url in ["/admin/", "/admin/tasks/task/", f"/admin/tasks/task/{letter.task_id}/change/",
                "/admin/tasks/deadletter/", f"/admin/tasks/deadletter/{letter.id}/change/",
                "/admin/tasks/worker/", "/admin/tasks/taskrun/", "/admin/signals/signal/"]:
        assert anon_client.get(url).status_code == 200, url
    # No form can move a task: posting a status change is refused.
    r = anon_client.post(f"/admin/tasks/task/{letter.task_id}/change/", {"status": "PENDING"})
    assert r.status_code == 403
    assert Task.objects.get(id=letter.task_id).status == "DEAD_LETTER"
    assert DeadLetter.objects.count() == 1
