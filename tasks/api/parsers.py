"""The API's one request parser: JSON, whose nesting answers 400, never 500.

DRF's JSONParser lets a RecursionError (JSON nested thousands of levels deep)
escape as a server error; this one refuses it with the API's error shape. The
body's size is checked before parsing (Django's DATA_UPLOAD_MAX_MEMORY_SIZE,
answered 413 by tasks.api.errors).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from tasks.errors import ValidationError
from tasks.specs import parse_json_text


class ValkaJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        raw = stream.read()
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            return parse_json_text(raw.decode(encoding))
        except RecursionError:
            raise ValidationError("body: JSON nested too deeply", {"body": ["JSON nested too deeply"]}) from None
        except (ValueError, LookupError) as exc:  # UnicodeDecodeError is a ValueError; LookupError: bad charset
            raise ParseError(f"JSON parse error - {exc}") from None
