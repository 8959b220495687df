"""Validation of what producers send, shared by REST, gRPC, the admin and Python callers.

`parse_task_spec` turns a mapping (JSON body, gRPC request, form) into a
`TaskSpec` or raises an error that names the offending field. Nothing is
written before a spec is valid.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from tasks.errors import PayloadTooLarge, ValidationError
from valka.conf import valka_settings
from valka_sdk.limits import MAX_NAME as MAX_NAME
from valka_sdk.limits import MAX_RETRIES_LIMIT as MAX_RETRIES_LIMIT
from valka_sdk.limits import QUEUE_PATTERN as QUEUE_PATTERN
from valka_sdk.limits import QUEUE_RE as QUEUE_RE
from valka_sdk.limits import QUEUE_RULE as QUEUE_RULE
from valka_sdk.limits import TIMEOUT_RANGE as TIMEOUT_RANGE

# The names' and numbers' rules (valka_sdk.limits, so that clients check them before sending);
# the models, the API's schema and the dispatcher's hello check import them from here.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_CONCURRENCY_KEY = 200
# A queue's limits (tasks.models.Queue): counts of tasks, and the rate limit's period in seconds.
LIMIT_RANGE = (1, INT32_MAX)
RATE_PERIOD_RANGE = (1, 86400)
# A \u0000 escape in JSON text (json.dumps writes NUL so), not a backslash-u that is itself escaped.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Deeper JSON is refused: PostgreSQL, psycopg and the JSON renderer all recurse per level.
MAX_JSON_DEPTH = 100
_JSON_SCALARS = frozenset({str, int, bool, type(None)})


# Not frozen: a frozen dataclass sets each of its eleven fields through object.__setattr__,
# about 4 µs of the 22 that validating one batched task took. Nothing changes a spec once made.
@dataclass(slots=True)
class TaskSpec:
    task_name: str
    queue: str
    input: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    max_retries: int = 3
    timeout_seconds: int = 300
    idempotency_key: str | None = None
    run_at: datetime | None = None  # None: now
    id: uuid.UUID | None = None  # made by the client (a repeat answers the task it names); None: by the server
    concurrency_key: str | None = None
    # `input` and `metadata` as JSON text, kept from validation so the insert does not encode them
    # again; None when the spec was built by hand.
    input_json: str | None = field(default=None, compare=False, repr=False)
    metadata_json: str | None = field(default=None, compare=False, repr=False)

    def input_text(self) -> str | None:
        """`input` as JSON text for a jsonb parameter, or None for SQL NULL."""
        if self.input is None:
            return None
        return self.input_json if self.input_json is not None else json.dumps(self.input, ensure_ascii=False)

    def metadata_text(self) -> str:
        return self.metadata_json if self.metadata_json is not None else json.dumps(self.metadata, ensure_ascii=False)


def _text(name: str, value: Any, *, required: bool, max_len: int = MAX_NAME) -> str | None:
    if value is None or value == "":
        if required:
            raise ValidationError.field(name, "this field is required")
        return None
    if not isinstance(value, str):
        raise ValidationError.field(name, "must be a string")
    if len(value) > max_len:
        raise ValidationError.field(name, f"must be at most {max_len} characters")
    check_text(name, value)
    return value


def check_text(name: str, value: str) -> None:
    """Refuse what PostgreSQL's text cannot hold: NUL characters, and lone surrogates (not UTF-8)."""
    if "\x00" in value:
        raise ValidationError.field(name, "must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValidationError.field(name, "must be valid Unicode (no lone surrogates)") from None


def _json_shape(value: Any) -> tuple[int, int | None]:
    """How deeply arrays and objects nest in `value` (0 for a scalar; counted without recursing, and
    only until past MAX_JSON_DEPTH), and the spaces `json.dumps` would put after its ':' and ','
    when `value` holds only what parsing JSON makes but floats (exactly dicts, lists, strings,
    integers, booleans, None), else None."""
    depth, level, spaces, plain = 0, [value], 0, True
    while True:
        below: list[Any] = []
        containers = False
        for item in level:
            if isinstance(item, dict):
                containers = True
                plain = plain and type(item) is dict
                if item:
                    spaces += 2 * len(item) - 1  # after each ':' and each ','
                    below.extend(item.values())
            elif isinstance(item, list):
                containers = True
                plain = plain and type(item) is list
                if item:
                    spaces += len(item) - 1
                    below.extend(item)
            elif plain and type(item) not in _JSON_SCALARS:
                plain = False
        if not containers:
            break
        depth += 1
        if depth > MAX_JSON_DEPTH:
            break
        level = below
    return depth, spaces if plain else None


def _int(name: str, value: Any, default: int, lo: int, hi: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValidationError.field(name, "must be an integer")
    if not lo <= value <= hi:
        raise ValidationError.field(name, f"must be between {lo} and {hi}")
    return value


def check_json(name: str, value: Any, limit: int) -> str:
    """Refuse a JSON value PostgreSQL cannot store, nested deeper than MAX_JSON_DEPTH, or over `limit` bytes.

    The size is that of `json.dumps(value, ensure_ascii=False)` in UTF-8. Returns the value as JSON text.

    orjson writes a small value in a tenth of the time `json.dumps` takes, and for plain values
    (see `_json_shape`) the same text but for the spaces after ':' and ',', which are counted.
    Floats go through `json.dumps` (orjson writes some exponents differently, and a NaN as null),
    as do other types and what orjson refuses: integers beyond 64 bits, lone surrogates, keys
    that are not strings."""
    depth, spaces = _json_shape(value)
    if depth > MAX_JSON_DEPTH:
        raise ValidationError.field(name, f"is nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    raw = None
    if spaces is not None:
        try:
            raw = orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
    if raw is not None:
        encoded, size = raw.decode(), len(raw) + spaces
    else:
        try:
            encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError):
            raise ValidationError.field(name, "must be valid JSON (no NaN or Infinity)") from None
        except RecursionError:
            raise ValidationError.field(name, "is nested too deeply") from None
        try:
            size = len(encoded) if encoded.isascii() else len(encoded.encode())
        except UnicodeEncodeError:
            raise ValidationError.field(name, "must be valid Unicode (no lone surrogates)") from None
    if size > limit:
        raise PayloadTooLarge(
            f"{name}: larger than the limit of {limit} bytes", {name: [f"larger than {limit} bytes"]}
        )
    if "\\u0000" in encoded and _ESCAPED_NUL.search(encoded):
        raise ValidationError.field(name, "must not contain NUL characters (PostgreSQL cannot store them)")
    return encoded


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_text(text: str, *, parse_float: Any = None) -> Any:
    """JSON text as Python, refusing NaN and Infinity, which JSON does not have (Python's parser
    takes them). Raises ValueError, or RecursionError for text nested too deeply to parse."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=parse_float)


def parse_datetime(name: str, value: Any) -> datetime | None:
    """RFC 3339 with a time zone (`Z` or an offset), or None for "now"."""
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str) and len(value) <= 64 and "T" in value.upper():
        try:
            # RFC 3339 allows a lower-case "t" and "z".
            parsed = datetime.fromisoformat(value.upper())
        except ValueError:
            raise ValidationError.field(name, "must be an RFC 3339 date-time with a time zone") from None
    else:
        raise ValidationError.field(name, "must be an RFC 3339 date-time with a time zone")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValidationError.field(name, "must include a time zone (Z or an offset)")
    try:
        # In UTC: PostgreSQL refuses offsets beyond ±15:59 that RFC 3339 allows, and the time must
        # exist in UTC (years 1 to 9999) to be read back.
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValidationError.field(name, "is out of range (years 1 to 9999 in UTC)") from None


def parse_task_id(name: str, value: Any) -> uuid.UUID | None:
    """A task id a client made: a UUID (version 7 keeps the newest-first order by id), or None."""
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        parsed = value
    elif isinstance(value, str) and len(value) <= 64:
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            raise ValidationError.field(name, "must be a UUID") from None
    else:
        raise ValidationError.field(name, "must be a UUID")
    return parsed


def _queue(data: Mapping[str, Any], name: str) -> str | None:
    if name not in data:
        return None
    queue = _text(name, data[name], required=True)
    assert queue is not None
    if not QUEUE_RE.match(queue):
        raise ValidationError.field(name, QUEUE_RULE)
    return queue


def parse_task_spec(data: Any) -> TaskSpec:
    """Validate a producer's request. Accepts `queue_name` for `queue` and `scheduled_at` for `run_at`:
    either may be sent, each is validated when present, and the first wins when both are."""
    if not isinstance(data, Mapping):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    task_name = _text("task_name", data.get("task_name"), required=True)
    queue = _queue(data, "queue")
    alias = _queue(data, "queue_name")
    if queue is None:
        queue = alias
    if queue is None:
        raise ValidationError.field("queue", "this field is required")
    assert task_name is not None
    conf = valka_settings.all()  # one settings look-up: this runs for each item of a batch
    limit = conf["MAX_PAYLOAD_BYTES"]
    payload = data.get("input")
    input_json = check_json("input", payload, limit)
    metadata = data.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise ValidationError.field("metadata", "must be a JSON object")
    metadata_json = check_json("metadata", metadata, limit) if metadata else "{}"
    idempotency_key = _text("idempotency_key", data.get("idempotency_key"), required=False)
    concurrency_key = _text("concurrency_key", data.get("concurrency_key"), required=False,
                            max_len=MAX_CONCURRENCY_KEY)
    priority = _int("priority", data.get("priority"), 0, INT32_MIN, INT32_MAX)
    max_retries = _int("max_retries", data.get("max_retries"), conf["MAX_RETRIES"], 0, MAX_RETRIES_LIMIT)
    timeout_seconds = _int(
        "timeout_seconds", data.get("timeout_seconds"), conf["DEFAULT_TIMEOUT_SECONDS"], *TIMEOUT_RANGE
    )
    run_at = parse_datetime("run_at", data.get("run_at"))
    scheduled_at = parse_datetime("scheduled_at", data.get("scheduled_at"))
    task_id = data.get("id")
    return TaskSpec(
        task_name=task_name,
        queue=queue,
        input=payload,
        metadata=metadata,
        priority=priority,
        max_retries=max_retries,
        timeout_seconds=timeout_seconds,
        idempotency_key=idempotency_key,
        run_at=run_at if run_at is not None else scheduled_at,
        id=None if task_id is None else parse_task_id("id", task_id),
        concurrency_key=concurrency_key,
        input_json=input_json,
        metadata_json=metadata_json,
    )


# -- A queue's settings (tasks.models.Queue; REST PATCH /api/v1/queues/{name}, the admin's form). --
QUEUE_LIMITS = ("max_running", "rate_limit", "max_running_per_key")
QUEUE_SETTINGS = (*QUEUE_LIMITS, "rate_period_seconds", "description")
MAX_DESCRIPTION = 1000


def _limit(name: str, value: Any) -> int | None:
    """A limit: a positive integer, or None for "no limit"."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if not (isinstance(value, float) and value.is_integer()):
            raise ValidationError.field(name, "must be a whole number, or null for no limit")
        value = int(value)
    if not LIMIT_RANGE[0] <= value <= LIMIT_RANGE[1]:
        low, high = LIMIT_RANGE
        raise ValidationError.field(name, f"must be between {low} and {high}, or null for no limit")
    return value


def _refuse_unknown(data: Mapping[str, Any], known: tuple[str, ...], hint: str = "") -> None:
    unknown = sorted(map(str, set(data) - set(known)))
    if unknown:
        raise ValidationError.field(unknown[0], f"is not one of {', '.join(known)}{hint}")


def parse_queue_changes(data: Any) -> dict[str, Any]:
    """The settings a request changes, each valid, as {column: value}: the limits (a positive
    integer, or null for none), `rate_period_seconds` (1 to 86400) and `description`. The pause
    is not among them: pausing and resuming are actions of their own, with their own permission."""
    if not isinstance(data, Mapping):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    _refuse_unknown(data, QUEUE_SETTINGS, "; pause and resume are /pause and /resume")
    changes: dict[str, Any] = {name: _limit(name, data[name]) for name in QUEUE_LIMITS if name in data}
    if "rate_period_seconds" in data:
        changes["rate_period_seconds"] = _int("rate_period_seconds", data["rate_period_seconds"], 1,
                                              *RATE_PERIOD_RANGE)
    if "description" in data:
        changes["description"] = _text("description", data["description"], required=False,
                                       max_len=MAX_DESCRIPTION) or ""
    return changes


def parse_pause(data: Any, *, now: datetime) -> datetime | None:
    """When a pause asked for ends by itself (`until`, after `now`), or None: until resumed."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ValidationError("the request body must be a JSON object", {"body": ["must be a JSON object"]})
    _refuse_unknown(data, ("until",))
    until = parse_datetime("until", data.get("until"))
    if until is not None and until <= now:
        raise ValidationError.field("until", "must be in the future")
    return until
