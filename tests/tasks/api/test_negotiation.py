"""The API's content negotiation answers what DRF's would, and refuses what DRF's refuses."""

import pytest
from django.http import Http404
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from tasks.api.negotiation import ValkaContentNegotiation
from tasks.api.renderers import ValkaJSONRenderer

ACCEPTS = [None, "", "*/*", "application/json", "application/json; indent=4", "application/*",
           "text/html, application/json;q=0.9", "application/json, text/plain"]


def _request(accept: str | None, query: str = "") -> Request:
    extra = {} if accept is None else {"HTTP_ACCEPT": accept}
    return Request(APIRequestFactory().get(f"/api/v1/tasks{query}", **extra))


def _answer(negotiation, request: Request, renderers: list, suffix: str | None = None):
    try:
        renderer, media_type = negotiation.select_renderer(request, renderers, suffix)
    except exceptions.NotAcceptable:
        return "406"
    except Http404:  # a format no renderer has
        return "404"
    return type(renderer), media_type


@pytest.mark.parametrize("accept", ACCEPTS + ["text/html", "application/xml"])
@pytest.mark.parametrize("query", ["", "?format=json", "?format=api"])
@pytest.mark.parametrize("renderers", [[ValkaJSONRenderer], [ValkaJSONRenderer, BrowsableAPIRenderer],
                                       [BrowsableAPIRenderer, ValkaJSONRenderer]], ids=["json", "json+api", "api+json"])
def test_the_same_answer_as_drf(accept, query, renderers):
    request = _request(accept, query)
    instances = [r() for r in renderers]
    assert (_answer(ValkaContentNegotiation(), request, instances)
            == _answer(DefaultContentNegotiation(), request, instances))


def test_the_plain_accepts_get_json_without_drfs_parsing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("DRF's negotiation ran")

    monkeypatch.setattr(DefaultContentNegotiation, "select_renderer", refuse)
    for accept in (None, "*/*", "application/json"):
        renderer, media_type = ValkaContentNegotiation().select_renderer(_request(accept), [ValkaJSONRenderer()])
        assert isinstance(renderer, ValkaJSONRenderer) and media_type == "application/json"


def test_a_format_suffix_goes_through_drf():
    request = _request("*/*")
    assert _answer(ValkaContentNegotiation(), request, [ValkaJSONRenderer()], "xml") == "404"


@pytest.mark.django_db
def test_the_api_uses_it(client_api):
    r = client_api.get("/api/v1/tasks", HTTP_ACCEPT="text/html")
    assert r.status_code == 406 and r.json()["error"]
    r = client_api.get("/api/v1/tasks", HTTP_ACCEPT="*/*")
    assert r.status_code == 200 and r["Content-Type"] == "application/json"
