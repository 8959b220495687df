"""REST endpoints for schedules: thin shells over `schedules.services` and `schedules.selectors`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from schedules import permissions as needs
from schedules import selectors, services
from schedules.serializers import ScheduleCreateSerializer, ScheduleSerializer, ScheduleUpdateSerializer
from tasks.api.pagination import PAGE_PARAMETERS, Page, paginate
from tasks.api.serializers import TaskSerializer
from tasks.api.views import ERRORS, query_param


class ScheduleViewSet(viewsets.ViewSet):
    pagination_class = Page
    lookup_field = "name"
    needs = {"list": needs.READ_SCHEDULES, "retrieve": needs.READ_SCHEDULES, "create": needs.CREATE_SCHEDULES,
             "partial_update": needs.CHANGE_SCHEDULES, "destroy": needs.DELETE_SCHEDULES,
             "trigger": needs.TRIGGER_SCHEDULES}

    @extend_schema(parameters=[OpenApiParameter("enabled", bool), OpenApiParameter("declared", bool),
                               OpenApiParameter("queue", str), *PAGE_PARAMETERS],
                   responses={200: ScheduleSerializer(many=True), **ERRORS})
    def list(self, request: Request) -> Response:
        qs = selectors.schedule_list(enabled=query_param(request, "enabled"), queue=query_param(request, "queue"),
                                     declared=query_param(request, "declared"))
        return paginate(self, request, qs, ScheduleSerializer)

    @extend_schema(request=ScheduleCreateSerializer, responses={201: ScheduleSerializer, **ERRORS})
    def create(self, request: Request) -> Response:
        schedule = services.schedule_create(data=request.data)
        return Response(ScheduleSerializer(schedule).data, status=201)

    @extend_schema(responses={200: ScheduleSerializer, **ERRORS})
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(ScheduleSerializer(selectors.schedule_get(name=name)).data)

    @extend_schema(request=ScheduleUpdateSerializer, responses={200: ScheduleSerializer, **ERRORS})
    def partial_update(self, request: Request, name: str) -> Response:
        services.schedule_update(name=name, data=request.data)
        return Response(ScheduleSerializer(selectors.schedule_get(name=name)).data)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, name: str) -> Response:
        services.schedule_delete(name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={201: TaskSerializer, **ERRORS},
                   description="Fire the schedule now: a task with the key schedule:<name>:manual:<uuid>.")
    def trigger(self, request: Request, name: str) -> Response:
        return Response(TaskSerializer(services.schedule_trigger(name=name)).data, status=201)
