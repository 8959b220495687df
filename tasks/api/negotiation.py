"""The API's content negotiation: DRF's, with its answer for the Accept headers nearly every
caller sends worked out without parsing them.

DRF parses the Accept header into media types and ranks them for every request, about 4% of a
task create's time in the web app, to pick the one renderer the API has. A request that asks for
no format and accepts anything (`*/*`, or no Accept header) or exactly `application/json` gets
what DRF would answer: that renderer, as `application/json`. Anything else goes through DRF.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation

JSON = "application/json"
PLAIN_ACCEPTS = frozenset({"*/*", JSON})  # an empty header is not one: DRF answers it 406


class ValkaContentNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request: Any, renderers: list[Any], format_suffix: str | None = None) -> tuple[Any, str]:
        if (renderers and renderers[0].media_type == JSON and not format_suffix
                and request.META.get("HTTP_ACCEPT", "*/*") in PLAIN_ACCEPTS
                and not request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)):
            return renderers[0], JSON
        return super().select_renderer(request, renderers, format_suffix)
