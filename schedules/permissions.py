"""What the schedule actions of the REST API need (see tasks.api.auth.Need): the permissions the
admin requires for the same actions (enable and disable are changes; trigger has its own)."""

from tasks.api.auth import Need
from tasks.models import ApiKey

READ_SCHEDULES = Need("schedules.view_schedule", ApiKey.Scope.READ)
CREATE_SCHEDULES = Need("schedules.add_schedule", ApiKey.Scope.WRITE)
CHANGE_SCHEDULES = Need("schedules.change_schedule", ApiKey.Scope.WRITE)
DELETE_SCHEDULES = Need("schedules.delete_schedule", ApiKey.Scope.ADMIN)
TRIGGER_SCHEDULES = Need("schedules.trigger_schedule", ApiKey.Scope.WRITE)
