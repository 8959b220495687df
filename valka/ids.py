"""Time-sortable UUIDs (version 7): the SDK's generator (`valka_sdk.ids`), so the ids that clients
make (a Django `TaskResult`'s) and the server's follow one clock and one format.

Kept under this name for the models and the migrations that point at `valka.ids.uuid7`.
"""

from valka_sdk.ids import uuid7, uuid7_many, uuid7_text_many

__all__ = ["uuid7", "uuid7_many", "uuid7_text_many"]
