"""REST endpoints for signals: thin shells over `signals.services`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from signals import services
from tasks.api.serializers import SignalSerializer
from tasks.api.views import ERRORS, Page, _paginate, _param


class SignalSendSerializer(serializers.Serializer):
    signal_type = serializers.CharField(max_length=255, help_text="Alias: signal_name.")
    signal_name = serializers.CharField(required=False, max_length=255)
    payload = serializers.JSONField(required=False, allow_null=True)


class SentSignalSerializer(SignalSerializer):
    delivered = serializers.BooleanField(read_only=True)

    class Meta(SignalSerializer.Meta):
        fields = [*SignalSerializer.Meta.fields, "delivered"]
        read_only_fields = fields


class SignalViewSet(viewsets.ViewSet):
    pagination_class = Page

    @extend_schema(request=SignalSendSerializer, responses={201: SentSignalSerializer, **ERRORS})
    def send(self, request: Request, pk: str) -> Response:
        signal_type, payload = services.parse_signal_request(request.data)
        signal, delivered = services.signal_send(task_id=pk, signal_type=signal_type, payload=payload)
        signal.delivered = delivered
        return Response(SentSignalSerializer(signal).data, status=201)

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=["PENDING", "DELIVERED", "ACKNOWLEDGED"]),
                               OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
                   responses={200: SignalSerializer(many=True), **ERRORS})
    def for_task(self, request: Request, pk: str) -> Response:
        qs = services.signal_list(task_id=pk, status=_param(request, "status"))
        return _paginate(self, request, qs, SignalSerializer)

    @extend_schema(responses={200: SignalSerializer, **ERRORS})
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(SignalSerializer(services.signal_get(signal_id=pk)).data)


__all__ = ["SignalViewSet"]
