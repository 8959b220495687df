"""The API key look-up that every authenticated request runs (tasks.api.auth)."""

from tasks.models import ApiKey

# The columns, in the order LIVE_KEY returns them (the model's, so the row builds an ApiKey).
KEY_FIELDS = [f.attname for f in ApiKey._meta.concrete_fields]

# -- The unrevoked key with this hash: one probe of the unique index on key_hash. --
# Written in SQL, as building it with the ORM costs more than running it; prepared once per
# connection (tasks.prepared).
LIVE_KEY = f"SELECT {', '.join(KEY_FIELDS)} FROM {ApiKey._meta.db_table} WHERE key_hash = %s AND NOT revoked"
