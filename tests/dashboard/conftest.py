import itertools

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

_names = itertools.count()


@pytest.fixture
def staff_client(django_user_model):
    """A client logged in as a staff user holding exactly the given permissions ("app.codename")."""

    def make(*perms: str) -> Client:
        user = django_user_model.objects.create_user(f"staff{next(_names)}", is_staff=True)  # force_login: no password
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        client = Client()
        client.force_login(user)
        return client

    return make
