"""GET /healthz: public, and answers whether the database does."""

import pytest

pytestmark = pytest.mark.django_db


def test_healthz_is_public(anon_client):
    r = anon_client.get("/healthz")
    assert r.status_code == 200 and r.json()["database"] == "ok"
