import pytest
from rest_framework.test import APIClient

from tasks.api.auth import api_key_create


@pytest.fixture
def anon_client():
    return APIClient()


@pytest.fixture
def api_key(db):
    return api_key_create(name="tests")[1]


@pytest.fixture
def client_api(api_key):
    """An API client that sends a valid key."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    return client
