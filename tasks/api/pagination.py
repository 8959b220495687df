"""Pages of list endpoints, each of bounded cost however large the table and however deep the page.

- `limit` (default 50, served at most 1000) and `offset` (at most MAX_OFFSET): an offset makes
  PostgreSQL read and drop every row before the page, so deep offsets are refused with a 400
  naming `offset`, as are values that are not numbers (DRF would quietly use its defaults).
- `cursor`: the page after a row, read from the list's index wherever it is (a keyset: the
  values of the list's ordering columns in the last row). Every page that has a next one
  answers `next_cursor` and a `next` link that uses it, so following `next` reaches any
  depth at the cost of the first page.
- `count` is exact up to COUNT_CAP rows and PostgreSQL's estimate beyond (`count_exact`
  says which), so no page counts a million rows; `has_more` is always exact.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from tasks.dashboard import COUNT_CAP, bounded_count
from tasks.errors import ValidationError

MAX_OFFSET = 10_000
MAX_LIMIT_PARAM = 2**63 - 1  # the largest `limit` taken (as `Page.max_limit`); beyond, a 400
MAX_CURSOR = 512  # characters: a cursor this server issued is far shorter

# The query parameters of every list endpoint, for its schema.
PAGE_PARAMETERS = [
    OpenApiParameter("limit", int, description="Page size (default 50; above 1000 serves 1000)"),
    OpenApiParameter("offset", int, description=f"Rows to skip, at most {MAX_OFFSET}: go deeper with `cursor`"),
    OpenApiParameter("cursor", str, description="The page after the one that answered this `next_cursor`"),
]


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


def _ordering(qs: QuerySet) -> list[tuple[str, bool]]:
    """The queryset's ordering as (field, descending); its last field must make rows unique."""
    fields = [(name.lstrip("-"), name.startswith("-")) for name in qs.query.order_by]
    assert fields and len({desc for _, desc in fields}) == 1, "a keyset needs an ordering in one direction"
    return fields


def cursor_of(row: Any, qs: QuerySet) -> str:
    """The cursor of the page after `row` of `qs`: its ordering values, opaque to clients."""
    values = [getattr(row, field) for field, _ in _ordering(qs)]
    text = json.dumps([v if isinstance(v, int) else v.isoformat() if isinstance(v, datetime) else str(v)
                       for v in values], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def after_cursor(qs: QuerySet, cursor: str, *, name: str = "cursor") -> QuerySet:
    """`qs` from the row after `cursor`'s on. For ordering (a, b) descending the condition is
    `a <= :a AND (a < :a OR b < :b)`: its first term is a range on a's index, so the scan
    starts at the cursor instead of reading and dropping every row before it."""
    fields = _ordering(qs)
    refused = ValidationError.field(name, "is not a cursor this server issued")
    if len(cursor) > MAX_CURSOR:
        raise refused
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(raw, list) or len(raw) != len(fields):
            raise refused
        values = [qs.model._meta.get_field(field).to_python(value)
                  for (field, _), value in zip(fields, raw, strict=True)]
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, DjangoValidationError):
        raise refused from None
    if any(value is None for value in values):
        raise refused
    op = "lt" if fields[0][1] else "gt"
    step = Q()  # (a < :a) OR (a = :a AND b < :b) OR ...
    for i, (field, _) in enumerate(fields):
        term = Q(**{f"{field}__{op}": values[i]})
        for (prior, _), value in zip(fields[:i], values[:i], strict=False):
            term &= Q(**{prior: value})
        step |= term
    return qs.filter(Q(**{f"{fields[0][0]}__{op}e": values[0]}) & step)


class Page(BasePagination):
    """`limit`, `offset` or `cursor`, and `count`, `count_exact`, `has_more`, `next`, `next_cursor`,
    `previous`, `results` in the answer."""

    default_limit = 50
    max_limit = 1000

    def get_limit(self, request: Any) -> int:
        limit = query_int(request, "limit", default=self.default_limit, lo=1, hi=MAX_LIMIT_PARAM)
        assert limit is not None
        return min(limit, self.max_limit)

    def get_offset(self, request: Any) -> int:
        offset = query_int(request, "offset", default=0, lo=0, hi=MAX_OFFSET)
        assert offset is not None
        return offset

    def paginate_queryset(self, queryset: QuerySet, request: Request, view: Any = None) -> list[Any]:
        self.request = request
        self.limit = self.get_limit(request)
        self.offset = self.get_offset(request)
        cursor = request.query_params.get("cursor") or ""
        if cursor and self.offset:
            raise ValidationError.field("offset", "cannot be used with cursor (a cursor already says where)")
        self.cursor = cursor
        page = after_cursor(queryset, cursor) if cursor else queryset
        rows = list(page[self.offset:self.offset + self.limit + 1])
        self.has_more = len(rows) > self.limit
        rows = rows[:self.limit]
        self.next_cursor = cursor_of(rows[-1], queryset) if self.has_more else None
        self.count, self.count_exact = bounded_count(queryset, COUNT_CAP)
        return rows

    def _next_link(self) -> str | None:
        if self.next_cursor is None:
            return None
        url = remove_query_param(self.request.build_absolute_uri(), "offset")
        return replace_query_param(url, "cursor", self.next_cursor)

    def _previous_link(self) -> str | None:
        if self.cursor or self.offset == 0:
            return None  # cursors go forward; a client keeps the ones it passed to go back
        url = self.request.build_absolute_uri()
        previous = self.offset - self.limit
        return remove_query_param(url, "offset") if previous <= 0 else replace_query_param(url, "offset", previous)

    def get_paginated_response(self, data: Any) -> Response:
        return Response(OrderedDict([
            ("count", self.count), ("count_exact", self.count_exact), ("has_more", self.has_more),
            ("next", self._next_link()), ("next_cursor", self.next_cursor), ("previous", self._previous_link()),
            ("results", data),
        ]))

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["count", "count_exact", "has_more", "next", "next_cursor", "previous", "results"],
            "properties": {
                "count": {"type": "integer", "description": (
                    f"Matching rows: exact up to {COUNT_CAP}, PostgreSQL's estimate beyond (see count_exact)")},
                "count_exact": {"type": "boolean", "description": "false when count is an estimate"},
                "has_more": {"type": "boolean", "description": "whether a next page exists (always exact)"},
                "next": {"type": "string", "nullable": True, "format": "uri",
                         "description": "The next page (by cursor), or null on the last page"},
                "next_cursor": {"type": "string", "nullable": True,
                                "description": "Pass as `cursor` for the next page; null on the last page"},
                "previous": {"type": "string", "nullable": True, "format": "uri",
                             "description": "The previous page of an offset page; null for cursor pages"},
                "results": schema,
            },
        }


def one_page(data: list[Any]) -> Response:
    """A list that is answered whole (every queue, say), in the shape of every page."""
    return Response(OrderedDict([
        ("count", len(data)), ("count_exact", True), ("has_more", False), ("next", None), ("next_cursor", None),
        ("previous", None), ("results", data),
    ]))


def paginate(view: Any, request: Request, qs: Any, serializer: Any) -> Response:
    """One page of `qs` through `view`'s paginator, serialized."""
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)
