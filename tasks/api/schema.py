"""Corrections to the generated OpenAPI schema, so it states what the API really accepts and answers.

Registered as a drf-spectacular postprocessing hook in settings. The fuzz test
(tests/tasks/api/test_fuzz.py) holds the API to this schema.
"""

from __future__ import annotations

from typing import Any

from tasks.api.pagination import MAX_CURSOR, MAX_LIMIT_PARAM, MAX_OFFSET

BIGINT_MAX = 2**63 - 1
NO_NUL = "^[^\\x00]*$"  # PostgreSQL text cannot hold NUL; the API refuses it (400) wherever it appears

# Integer query parameters and the range the views accept (tasks.api.pagination, the logs view).
QUERY_INTEGERS: dict[str, dict[str, int]] = {
    "limit": {"minimum": 1, "maximum": MAX_LIMIT_PARAM},  # above Page.max_limit (1000) it serves that
    "offset": {"minimum": 0, "maximum": MAX_OFFSET},
    "after": {"minimum": 0, "maximum": BIGINT_MAX},
    "after_id": {"minimum": 0, "maximum": BIGINT_MAX},
}

# Answers any operation can give besides its own: a malformed request (400), no or a wrong API
# key (401), an id that names nothing (404), an `Accept` the API cannot serve (406), a body over
# the size limit (413), a body that is not JSON (415).
COMMON_ERRORS = {
    "400": "Invalid request: `details` names the offending field",
    "401": "No API key, or one that is wrong or revoked",
    "403": "The caller may not do this: its API key's scope, or its staff user's permission, falls short",
    "404": "No such object",
    "406": "The API answers only application/json",
    "413": "The request body, or one of its JSON fields, is over the size limit",
    "415": "The request body must be application/json",
}
BODY_ERRORS = ("413", "415")

# Request bodies that refuse fields they do not name (400 naming the field).
CLOSED = ("PatchedQueueChangeRequest", "QueuePauseRequest")

# Request bodies whose field has an alias: one of the two is required (the first wins).
ALIASES = {"TaskCreateRequest": ("queue", "queue_name"), "SignalSendRequest": ("signal_type", "signal_name")}


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                _query_parameter(parameter)
            responses = operation.setdefault("responses", {})
            for code, description in COMMON_ERRORS.items():
                if code in BODY_ERRORS and method not in ("post", "put", "patch"):
                    continue
                answer = responses.setdefault(code, {"content": error, "description": description})
                if not answer.get("description"):
                    answer["description"] = description
    schemas = result.get("components", {}).get("schemas", {})
    for name, (field, alias) in ALIASES.items():
        _alias_required(schemas.get(name), field, alias)
    create = schemas.get("TaskCreateRequest")
    if create:
        props = create["properties"]
        props["queue_name"].update({k: props["queue"][k] for k in ("pattern", "maxLength")})
        # null stands for "not given" (the default) in every optional field but the two queue names.
        for name, prop in props.items():
            if name not in ("task_name", "queue", "queue_name"):
                prop["nullable"] = True
        # An empty idempotency or concurrency key is no key.
        props["idempotency_key"].pop("minLength", None)
        props["concurrency_key"].pop("minLength", None)
    # A queue's settings and a pause take only the fields they name: a misspelt limit is refused.
    for name in CLOSED:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    for schema in schemas.values():
        for prop in schema.get("properties", {}).values():
            if prop.get("type") == "string" and "format" not in prop and "enum" not in prop:
                prop.setdefault("pattern", NO_NUL)
    return result


def _query_parameter(parameter: dict[str, Any]) -> None:
    if parameter["in"] != "query":
        return
    # An empty value counts as not given.
    parameter["allowEmptyValue"] = True
    bounds = QUERY_INTEGERS.get(parameter["name"])
    if bounds is not None:
        parameter["schema"] = {"type": "integer", **bounds}
    elif parameter["schema"].get("type") == "string" and "enum" not in parameter["schema"] \
            and "format" not in parameter["schema"]:
        parameter["schema"]["pattern"] = NO_NUL
        if parameter["name"] == "cursor":
            parameter["schema"]["maxLength"] = MAX_CURSOR


def _alias_required(schema: dict[str, Any] | None, field: str, alias: str) -> None:
    if not schema or field not in schema.get("required", []):
        return
    schema["required"] = [name for name in schema["required"] if name != field]
    if not schema["required"]:
        del schema["required"]
    schema["anyOf"] = [{"required": [field]}, {"required": [alias]}]
    schema["properties"][field]["description"] = f"Required unless `{alias}` is given."
