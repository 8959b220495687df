"""The OpenAPI schema (/api/schema/) and its Swagger page (/api/docs/): public, and list the API."""

import pytest

pytestmark = pytest.mark.django_db


def test_schema_and_docs(anon_client):
    schema = anon_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert "/api/v1/tasks" in schema.content.decode()
    for path in ("/api/v1/tasks/", "/api/v1/tasks/batch/"):
        create = schema.json()["paths"][path]["post"]
        assert {(p["name"], p["in"]) for p in create["parameters"]} == {("traceparent", "header"),
                                                                         ("tracestate", "header")}
    docs = anon_client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
