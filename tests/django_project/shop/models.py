from django.db import models


class Order(models.Model):
    """A row of the project's own, to enqueue beside in one transaction."""

    total = models.IntegerField()
