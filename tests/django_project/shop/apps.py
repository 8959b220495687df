from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.django_project.shop"

    def ready(self):
        from tests.django_project.shop import receivers  # noqa: F401 (connects them)
