"""One error shape for the whole REST API: {"error": CODE, "message": ..., "details": {...}}."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from tasks.errors import ValkaError

_DRF_CODES = {
    status.HTTP_400_BAD_REQUEST: "VALIDATION_ERROR",
    status.HTTP_401_UNAUTHORIZED: "UNAUTHORIZED",
    status.HTTP_403_FORBIDDEN: "FORBIDDEN",
    status.HTTP_404_NOT_FOUND: "NOT_FOUND",
    status.HTTP_405_METHOD_NOT_ALLOWED: "METHOD_NOT_ALLOWED",
    status.HTTP_406_NOT_ACCEPTABLE: "NOT_ACCEPTABLE",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "PAYLOAD_TOO_LARGE",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "UNSUPPORTED_MEDIA_TYPE",
    status.HTTP_429_TOO_MANY_REQUESTS: "THROTTLED",
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": code, "message": message, "details": details or {}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ValkaError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.http_status)
    if isinstance(exc, Http404):
        return Response(error_body("NOT_FOUND", "not found"), status=404)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(error_body("PAYLOAD_TOO_LARGE", f"body: larger than the limit of {limit} bytes",
                                   {"body": [f"larger than {limit} bytes"]}), status=413)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = _DRF_CODES.get(response.status_code, "ERROR")
    if isinstance(exc, exceptions.ParseError):
        message = f"malformed request body: {exc.detail}"
        details: dict[str, Any] = {"body": [str(exc.detail)]}
    elif isinstance(exc, exceptions.ValidationError):
        message = "invalid request"
        details = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
    else:
        message = str(getattr(exc, "detail", exc))
        details = {}
    response.data = error_body(code, message, details)
    return response
