"""What the signal actions of the REST API and gRPC's ApiService need (see tasks.api.auth.Need):
the permissions the admin requires to see and to send signals."""

from tasks.api.auth import Need
from tasks.models import ApiKey

READ_SIGNALS = Need("signals.view_signal", ApiKey.Scope.READ)
SEND_SIGNALS = Need("signals.add_signal", ApiKey.Scope.WRITE)
