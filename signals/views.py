"""REST endpoints for signals: thin shells over `signals.services`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from signals import services
from signals.permissions import READ_SIGNALS, SEND_SIGNALS
from signals.serializers import SentSignalSerializer, SignalSendSerializer, SignalSerializer
from tasks.api.pagination import PAGE_PARAMETERS, Page, paginate
from tasks.api.views import ERRORS, query_param


class SignalViewSet(viewsets.ViewSet):
    pagination_class = Page
    needs = {"send": SEND_SIGNALS, "for_task": READ_SIGNALS, "retrieve": READ_SIGNALS}

    @extend_schema(request=SignalSendSerializer, responses={201: SentSignalSerializer, **ERRORS})
    def send(self, request: Request, pk: str) -> Response:
        signal_type, payload = services.parse_signal_request(request.data)
        signal, delivered = services.signal_send(task_id=pk, signal_type=signal_type, payload=payload)
        signal.delivered = delivered
        return Response(SentSignalSerializer(signal).data, status=201)

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=["PENDING", "DELIVERED", "ACKNOWLEDGED"]),
                               *PAGE_PARAMETERS],
                   responses={200: SignalSerializer(many=True), **ERRORS})
    def for_task(self, request: Request, pk: str) -> Response:
        qs = services.signal_list(task_id=pk, status=query_param(request, "status"))
        return paginate(self, request, qs, SignalSerializer)

    @extend_schema(responses={200: SignalSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(SignalSerializer(services.signal_get(signal_id=pk)).data)


__all__ = ["SignalViewSet"]
