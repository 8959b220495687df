"""API keys: `create_api_key NAME --scope ...` (default write), and the admin, which shows each
key's scope and where a change of scope or a revocation holds from the key's next call."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from tasks.models import ApiKey, Task
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db
TASK = {"task_name": "t", "queue": "q"}


def create_key(capsys, *args: str) -> tuple[ApiKey, Client]:
    call_command("create_api_key", *args)
    out = capsys.readouterr().out.strip().splitlines()
    key = out[-1]
    record = ApiKey.objects.get(prefix=key[:10])
    assert f"scope {record.scope}" in out[0], out
    return record, Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def post_task(client: Client) -> int:
    return client.post("/api/v1/tasks", TASK, content_type="application/json").status_code


def test_create_api_key_makes_write_keys_by_default(capsys):
    record, client = create_key(capsys, "svc")
    assert record.scope == ApiKey.Scope.WRITE
    assert post_task(client) == 201
    done = TaskFactory(status="COMPLETED")
    assert client.delete(f"/api/v1/tasks/{done.id}").status_code == 403, "deleting needs admin"


@pytest.mark.parametrize("scope, create, delete", [("read", 403, 403), ("write", 201, 403), ("admin", 201, 204)])
def test_create_api_key_takes_a_scope(capsys, scope, create, delete):
    record, client = create_key(capsys, f"{scope}-svc", "--scope", scope)
    assert record.scope == scope
    assert client.get("/api/v1/tasks").status_code == 200
    assert post_task(client) == create
    assert client.delete(f"/api/v1/tasks/{TaskFactory(status='COMPLETED').id}").status_code == delete


def test_create_api_key_refuses_an_unknown_scope():
    with pytest.raises(CommandError, match="scope"):
        call_command("create_api_key", "svc", "--scope", "root")
    assert not ApiKey.objects.exists()


def test_the_admin_lists_keys_with_their_scope_and_makes_none(admin_client, capsys):
    reader, _ = create_key(capsys, "reporting", "--scope", "read")
    create_key(capsys, "billing")
    html = admin_client.get("/admin/tasks/apikey/").content.decode()
    row = html[html.index("reporting"):html.index("</tr>", html.index("reporting"))]
    assert reader.prefix in row and '<td class="field-scope">Read</td>' in row
    assert "billing" in html and '<td class="field-scope">Write</td>' in html
    filtered = admin_client.get("/admin/tasks/apikey/", {"scope__exact": "read"}).content.decode()
    assert "reporting" in filtered and "billing" not in filtered
    assert admin_client.get("/admin/tasks/apikey/add/").status_code == 403, "keys are made by create_api_key"
    page = admin_client.get(f"/admin/tasks/apikey/{reader.pk}/change/").content.decode()
    assert 'name="scope"' in page and 'name="revoked"' in page and reader.key_hash in page


def change(admin_client: Client, record: ApiKey, **fields) -> None:
    data = {"name": record.name, "scope": record.scope, **fields}
    if fields.get("revoked", record.revoked):
        data["revoked"] = "on"
    else:
        data.pop("revoked", None)
    response = admin_client.post(f"/admin/tasks/apikey/{record.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]


def test_a_scope_changed_in_the_admin_holds_from_the_next_call(admin_client, capsys):
    record, client = create_key(capsys, "svc")
    assert post_task(client) == 201
    change(admin_client, record, scope="read")
    assert ApiKey.objects.get(pk=record.pk).scope == "read"
    assert post_task(client) == 403 and Task.objects.count() == 1
    assert client.get("/api/v1/tasks").status_code == 200


def test_a_key_revoked_in_the_admin_is_refused_from_the_next_call(admin_client, capsys):
    record, client = create_key(capsys, "leaked", "--scope", "admin")
    assert client.get("/api/v1/tasks").status_code == 200
    change(admin_client, record, revoked=True)
    assert ApiKey.objects.get(pk=record.pk).revoked
    assert client.get("/api/v1/tasks").status_code == 401
    assert post_task(client) == 401 and not Task.objects.exists()
    html = admin_client.get("/admin/tasks/apikey/", {"revoked__exact": "1"}).content.decode()
    assert "leaked" in html
