"""Pages of list endpoints: `limit` and `offset`, refused with a 400 when they are not numbers.

DRF's LimitOffsetPagination quietly falls back to its defaults on a bad value;
a client that sends `offset=abc` or `offset=1e40` gets an error naming the
parameter instead, and no number ever reaches SQL outside bigint's range.
"""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

from tasks.errors import ValidationError

MAX_OFFSET = 2**31 - 1
MAX_LIMIT_PARAM = 2**63 - 1  # the largest `limit` taken (as `Page.max_limit`); beyond, a 400


def query_int(request: Any, name: str, *, default: int | None, lo: int, hi: int | None = None) -> int | None:
    """An integer query parameter within [lo, hi]; values above `hi` are refused (None: no upper bound)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    text = raw.strip()
    if not (text.isascii() and text.lstrip("+-").isdigit()) or len(text) > 20:
        raise ValidationError.field(name, "must be an integer")
    value = int(text)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ValidationError.field(name, f"must be {bound}")
    return value


class Page(LimitOffsetPagination):
    """`limit` 1.. (default 50; more than 1000 is served as 1000), `offset` 0..2**31-1."""

    default_limit = 50
    max_limit = 1000

    def get_limit(self, request: Any) -> int:
        limit = query_int(request, self.limit_query_param, default=self.default_limit, lo=1, hi=MAX_LIMIT_PARAM)
        assert limit is not None
        return min(limit, self.max_limit)

    def get_offset(self, request: Any) -> int:
        offset = query_int(request, self.offset_query_param, default=0, lo=0, hi=MAX_OFFSET)
        assert offset is not None
        return offset

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {"name": self.limit_query_param, "required": False, "in": "query",
             "description": f"Page size (default {self.default_limit}; above {self.max_limit} serves {self.max_limit})",
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT_PARAM}},
            {"name": self.offset_query_param, "required": False, "in": "query",
             "description": "How many results to skip", "schema": {"type": "integer", "minimum": 0,
                                                                  "maximum": MAX_OFFSET}},
        ]


def paginate(view: Any, request: Request, qs: Any, serializer: Any) -> Response:
    """One page of `qs` through `view`'s paginator, serialized."""
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)
