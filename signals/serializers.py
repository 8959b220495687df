"""The REST API's shapes of a signal (request shapes document the fields; `signals.services`
validates them)."""

from rest_framework import serializers

from signals.models import Signal
from tasks.specs import MAX_NAME


class SignalSerializer(serializers.ModelSerializer):
    task_id = serializers.UUIDField(read_only=True)
    signal_name = serializers.CharField(source="signal_type", read_only=True)
    payload = serializers.JSONField(allow_null=True)

    class Meta:
        model = Signal
        fields = [
            "id", "task_id", "signal_type", "signal_name", "payload", "status", "created_at",
            "delivered_at", "acknowledged_at",
        ]
        read_only_fields = fields


class SignalSendSerializer(serializers.Serializer):
    signal_type = serializers.CharField(max_length=MAX_NAME, help_text="Alias: signal_name.")
    signal_name = serializers.CharField(required=False, max_length=MAX_NAME)
    payload = serializers.JSONField(required=False, allow_null=True)


class SentSignalSerializer(SignalSerializer):
    delivered = serializers.BooleanField(read_only=True)

    class Meta(SignalSerializer.Meta):
        fields = [*SignalSerializer.Meta.fields, "delivered"]
        read_only_fields = fields
