"""Writes: the one service layer that the REST API, gRPC, the admin and Django code call.

Named entity-first with keyword-only arguments. Every status change is a
guarded statement from `tasks.sql`; a statement that changes nothing is
turned into NOT_FOUND or INVALID_STATE by looking at the row afterwards,
never by deciding from a read made before the write.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from tasks import offer_misses, selectors, tracing
from tasks.errors import InvalidState, NotFound, ValidationError, ValkaError
from tasks.models import DeadLetter, Queue, Task
from tasks.prepared import fetchone_prepared
from tasks.specs import TaskSpec, parse_pause, parse_queue_changes, parse_task_spec
from tasks.sql import lifecycle, producer
from tasks.sql import queues as queues_sql
from tasks.states import FINAL_STATES, REPLAYABLE, TaskStatus, sources_of
from valka.ids import uuid7, uuid7_many

MAX_BATCH = 1000  # tasks per batch call (REST, SDK, task_enqueue_many)


def task_enqueue(
    *,
    task_name: str,
    queue: str,
    input: Any = None,
    metadata: Mapping[str, Any] | None = None,
    priority: int | None = None,
    max_retries: int | None = None,
    timeout_seconds: int | None = None,
    idempotency_key: str | None = None,
    run_at: Any = None,
    id: uuid.UUID | str | None = None,
    concurrency_key: str | None = None,
) -> Task:
    """Enqueue a task from Django code: the fast, in-process producer path.

    Runs inside the caller's transaction when there is one, so the task and
    its NOTIFY commit together with the caller's own rows, or not at all.
    With an idempotency key or an `id` (made by the caller) that exists,
    returns the existing task.
    """
    spec = parse_task_spec(
        {
            "task_name": task_name,
            "queue": queue,
            "input": input,
            "metadata": dict(metadata) if metadata is not None else None,
            "priority": priority,
            "max_retries": max_retries,
            "timeout_seconds": timeout_seconds,
            "idempotency_key": idempotency_key,
            "run_at": run_at,
            "id": id,
            "concurrency_key": concurrency_key,
        }
    )
    return task_create(spec=spec)[0]


def task_create_from_data(*, data: Any) -> tuple[Task, bool]:
    """Validate a producer's request (REST/gRPC/admin) and create the task."""
    return task_create(spec=parse_task_spec(data))


def task_create(*, spec: TaskSpec) -> tuple[Task, bool]:
    """Insert one task, or find the holder of its id or idempotency key. Returns (task, created)."""
    return _create([spec])[0]


def task_enqueue_many(tasks: Iterable[Mapping[str, Any]]) -> list[Task]:
    """Enqueue up to MAX_BATCH tasks from Django code in one INSERT, in the caller's transaction.

    Each item holds `task_enqueue`'s arguments. Every item is validated first and
    the first invalid one raises (its field named `tasks[i].<field>`) before
    anything is written. Returns the tasks in order; an item whose idempotency
    key exists (or repeats an earlier item's) gets the task that holds the key.
    """
    specs = []
    for i, item in enumerate(tasks):
        try:
            specs.append(parse_task_spec(item))
        except ValkaError as exc:
            raise type(exc)(f"tasks[{i}].{exc.message}", {f"tasks[{i}]": exc.details}) from None
    return [task for task, _created in task_create_many(specs=specs)]


def task_create_many_from_data(*, items: Any) -> list[tuple[Task, bool] | ValkaError]:
    """Validate each of a producer's items on its own and create the valid ones in one INSERT.

    Returns, in order, (task, created) for each valid item and the error for each
    invalid one: an invalid item does not stop the others. More than MAX_BATCH
    items, or anything but a list, is a ValidationError for the whole request.
    """
    if not isinstance(items, list):
        raise ValidationError.field("tasks", "must be a list of task objects")
    if len(items) > MAX_BATCH:
        raise ValidationError.field("tasks", f"at most {MAX_BATCH} tasks per request (got {len(items)})")
    outcomes: list[tuple[Task, bool] | ValkaError | None] = [None] * len(items)
    valid: list[tuple[int, TaskSpec]] = []
    for i, item in enumerate(items):
        try:
            if not isinstance(item, Mapping):
                raise ValidationError("a task must be a JSON object", {"task": ["must be a JSON object"]})
            valid.append((i, parse_task_spec(item)))
        except ValkaError as exc:
            outcomes[i] = exc
    for (i, _spec), created in zip(valid, task_create_many(specs=[spec for _, spec in valid]), strict=True):
        outcomes[i] = created
    return outcomes  # type: ignore[return-value]  # every slot is filled


def task_create_many(*, specs: Sequence[TaskSpec]) -> list[tuple[Task, bool]]:
    """Insert up to MAX_BATCH valid specs with one statement; (task, created) for each, in order.

    One multi-row INSERT ... ON CONFLICT DO NOTHING, then one SELECT for the ids and
    keys that were taken. Items repeating an id or key of the same batch resolve to the
    first one's task. The INSERT takes the keys in sorted order, so concurrent batches
    that share keys wait for each other instead of deadlocking. A key whose holder
    is deleted between the two statements is inserted again (three tries).
    """
    if len(specs) > MAX_BATCH:
        raise ValidationError.field("tasks", f"at most {MAX_BATCH} tasks per batch (got {len(specs)})")
    return _create(specs)


def _create(specs: Sequence[TaskSpec], links: Mapping[str, Any] | None = None) -> list[tuple[Task, bool]]:
    """Insert `specs`, or find the holders of their ids (made by the client) and idempotency keys:
    the one insert path, with its retry for holders deleted meanwhile. A spec whose id exists
    answers that task; one whose key exists, the key's task (its id, if new, is not used). Later
    specs of the batch repeating an id or key resolve to the first one's task. `links` (a replay's
    origin) go to every row. The tasks carry the caller's trace context (`tasks.tracing`)."""
    with tracing.enqueue(specs) as span:
        created = _insert_or_find(specs, links)
        tracing.created(span, created)
    return created


def _insert_or_find(specs: Sequence[TaskSpec], links: Mapping[str, Any] | None) -> list[tuple[Task, bool]]:
    results: list[tuple[Task, bool] | None] = [None] * len(specs)
    pending = list(range(len(specs)))
    for _ in range(3):
        seen: set[Any] = set()
        to_insert = []
        for i in pending:
            spec = specs[i]
            task_id, key = spec.id, spec.idempotency_key
            if task_id is None and key is None:
                to_insert.append(i)
            elif (task_id is None or task_id not in seen) and (key is None or key not in seen):
                seen.update(name for name in (task_id, key) if name is not None)
                to_insert.append(i)
        inserted = _insert_rows([specs[i] for i in to_insert], links or {})
        by_id: dict[uuid.UUID, Task] = {}
        by_key: dict[str, Task] = {}
        for i, task in zip(to_insert, inserted, strict=True):
            if task is not None:
                results[i] = (task, True)
                by_id[task.id] = task
                if task.idempotency_key is not None:
                    by_key[task.idempotency_key] = task
        taken = [specs[i] for i, task in zip(to_insert, inserted, strict=True) if task is None]
        if taken:
            # ON CONFLICT waited for each holder to commit, so they are visible now.
            holders = Task.objects.raw(producer.SELECT_HOLDERS, {
                "ids": [s.id for s in taken if s.id is not None],
                "keys": [s.idempotency_key for s in taken if s.idempotency_key is not None]})
            for task in holders:
                by_id[task.id] = task
                if task.idempotency_key is not None:
                    by_key[task.idempotency_key] = task
        still = []
        for i in pending:
            if results[i] is None:
                spec = specs[i]
                holder = by_id.get(spec.id) if spec.id is not None else None  # type: ignore[arg-type]
                if holder is None and spec.idempotency_key is not None:
                    holder = by_key.get(spec.idempotency_key)
                if holder is None:
                    still.append(i)  # the holder was deleted in between: try again
                else:
                    results[i] = (holder, False)
        pending = still
        if not pending:
            return [result for result in results if result is not None]
    raise InvalidState("ids or idempotency keys are being reused concurrently; retry the request")


_TASK_FIELDS = [f.attname for f in Task._meta.concrete_fields]
_TASK_COLUMNS_NULL = dict.fromkeys(_TASK_FIELDS)


def _insert_rows(specs: list[TaskSpec], links: Mapping[str, Any]) -> list[Task | None]:
    """One statement, prepared, for `specs`: the new task for each, or None where its key was taken.

    The new rows are built from what was sent and the statement's time (their creation
    time, and the due time of those given none), not read back: the statement's triggers
    run after the insert and change nothing. A single task takes INSERT_TASK, which is faster
    than a batch of one; more take INSERT_TASKS.
    """
    if not specs:
        return []
    if len(specs) == 1:
        return [_insert_one(specs[0], links)]
    made = iter(uuid7_many(sum(1 for s in specs if s.id is None)))
    uuids = [s.id if s.id is not None else next(made) for s in specs]
    ids = [str(task_id) for task_id in uuids]
    row = fetchone_prepared(producer.INSERT_TASKS, {"tasks": _rows_json(ids, specs, links)})
    assert row is not None  # the statement answers one row, whatever it inserted
    inserted, now, _notified = row
    new_ids = set(inserted.split(",")) if inserted else set()
    base, heard = _task_base(now, links), _init_heard()  # once for the batch
    return [
        _new_task(task_uuid, s, s.run_at or now, base, heard) if task_id in new_ids else None
        for task_uuid, task_id, s in zip(uuids, ids, specs, strict=True)
    ]


async def task_create_awaited(spec: TaskSpec,
                              fetchone: Callable[[str, Mapping[str, Any]], Awaitable[Sequence[Any] | None]],
                              ) -> Task | None:
    """`task_create` of a spec with neither id nor key held, its one INSERT run by `fetchone` (an
    async connection's: tasks.api.direct's create on the event loop) and awaited, in the same
    enqueue span. None when its id or idempotency key is held: nothing was written, and
    `task_create` finds the holder."""
    with tracing.enqueue([spec]) as span:
        params = _insert_params(spec, {})
        sql = offer_misses.statement(spec)
        row = await fetchone(sql, params)
        offer_misses.answered(sql, spec, row)
        if row is None:
            return None
        task = _task_inserted(params, spec, row, {})
        tracing.created(span, [(task, True)])
        return task


def _insert_params(spec: TaskSpec, links: Mapping[str, Any]) -> dict[str, Any]:
    """INSERT_TASK's parameters for `spec` (its id made here when it has none)."""
    return {
        "id": spec.id or uuid7(), "task_name": spec.task_name, "queue": spec.queue, "priority": spec.priority,
        "max_retries": spec.max_retries, "timeout_seconds": spec.timeout_seconds,
        "idempotency_key": spec.idempotency_key, "input": spec.input_text(), "metadata": spec.metadata_text(),
        "run_at": spec.run_at, "replayed_from_task_id": links.get("replayed_from_task_id"),
        "replayed_from_dead_letter_id": links.get("replayed_from_dead_letter_id"),
        "concurrency_key": spec.concurrency_key,
    }


def _insert_one(spec: TaskSpec, links: Mapping[str, Any]) -> Task | None:
    """INSERT_TASK (or INSERT_TASK_PENDING, tasks.offer_misses): the new task, or None when its key
    was taken."""
    params = _insert_params(spec, links)
    sql = offer_misses.statement(spec)
    row = fetchone_prepared(sql, params)
    offer_misses.answered(sql, spec, row)
    return None if row is None else _task_inserted(params, spec, row, links)


def _task_inserted(params: Mapping[str, Any], spec: TaskSpec, row: Sequence[Any], links: Mapping[str, Any]) -> Task:
    """The task INSERT_TASK made of `params`, from its answer `row`: built, not read back (see
    `_insert_rows`)."""
    run_at, created_at, status, claimed_by, _notified = row
    task = _new_task(params["id"], spec, run_at, _task_base(created_at, links), _init_heard())
    task.status, task.claimed_by = status, claimed_by  # DISPATCHING when handed over in the INSERT
    return task


def _rows_json(ids: list[str], specs: list[TaskSpec], links: Mapping[str, Any]) -> str:
    """The batch as INSERT_TASKS's JSON array, put together from the JSON text that validation
    already made of each input and metadata, instead of encoding them all a second time.
    Names, queues and keys repeat across a batch: each distinct one is encoded once. `links`
    (a replay's origin ids) are written into every row; absent, the columns are NULL."""
    quoted: dict[str, str] = {}

    def q(text: str | None) -> str:
        if text is None:
            return "null"
        encoded = quoted.get(text)
        if encoded is None:
            encoded = quoted[text] = json.dumps(text, ensure_ascii=False)
        return encoded

    shared = "".join(f',"{name}":"{value}"' for name, value in links.items() if value is not None)
    return "[" + ",".join(
        f'{{"id":"{task_id}","task_name":{q(s.task_name)},"queue":{q(s.queue)},"priority":{int(s.priority)},'
        f'"max_retries":{int(s.max_retries)},"timeout_seconds":{int(s.timeout_seconds)},'
        f'"idempotency_key":{q(s.idempotency_key)},"input":{s.input_text() or "null"},'
        f'"metadata":{s.metadata_text()},"run_at":{q(s.run_at.isoformat() if s.run_at else None)},'
        f'"concurrency_key":{q(s.concurrency_key)}{shared}}}'
        for task_id, s in zip(ids, specs, strict=True)
    ) + "]"


def _init_heard() -> bool:
    """Whether something listens for Task's init signals."""
    return pre_init.has_listeners(Task) or post_init.has_listeners(Task)


def _task_base(created_at: Any, links: Mapping[str, Any]) -> dict[str, Any]:
    """The columns a new task takes from neither its spec nor its due time: the same for every task
    of one INSERT, so a batch builds them once."""
    return {
        **_TASK_COLUMNS_NULL, "status": TaskStatus.PENDING.value, "attempt_count": 0,
        "created_at": created_at, "updated_at": created_at,
        "replayed_from_task_id": links.get("replayed_from_task_id"),
        "replayed_from_dead_letter_id": links.get("replayed_from_dead_letter_id"),
    }


def _new_task(task_id: uuid.UUID, spec: TaskSpec, run_at: Any, base: dict[str, Any], init_heard: bool) -> Task:
    """The Task row just inserted for `spec`, from what was sent and the times the server set.

    Built as `Model.from_db` would build it, without `Model.__init__`'s per-field work (about
    20 µs for this model, more than validating the task), unless something listens for the
    model's init signals (`init_heard`, from `_init_heard`).
    """
    values = base.copy()
    values["id"] = task_id
    values["task_name"] = spec.task_name
    values["queue"] = spec.queue
    values["priority"] = spec.priority
    values["max_retries"] = spec.max_retries
    values["timeout_seconds"] = spec.timeout_seconds
    values["idempotency_key"] = spec.idempotency_key
    values["input"] = spec.input
    values["metadata"] = spec.metadata
    values["run_at"] = run_at
    values["concurrency_key"] = spec.concurrency_key
    if init_heard:
        return Task.from_db(DEFAULT_DB_ALIAS, _TASK_FIELDS, [values[name] for name in _TASK_FIELDS])
    task = Task.__new__(Task)
    task.__dict__ = values
    state = task._state = ModelState()
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    return task


def task_cancel(*, task_id: uuid.UUID | str, reason: str | None = "cancelled") -> Task:
    """PENDING, DISPATCHING or RUNNING → CANCELLED; the task's live run is closed too, even one a
    start committed while the cancel waited for it (lifecycle.CLOSE_RUN_OF_CANCELLED).

    Locks the task row until the transaction ends. If another process moved the
    task first, nothing changes and INVALID_STATE names the status it found.
    """
    task_id = _uuid(task_id)
    params = {"id": task_id, "reason": reason}
    with transaction.atomic():
        rows = list(Task.objects.raw(lifecycle.CANCEL_TASK, params))
        if rows and rows[0].started_at is not None:  # it had started: a run may have just been written
            with connection.cursor() as cursor:
                cursor.execute(lifecycle.CLOSE_RUN_OF_CANCELLED, params)
    if rows:
        return rows[0]
    current = selectors.task_get(task_id=task_id)
    raise InvalidState(
        f"task {task_id} is {current.status}; "
        f"only {', '.join(sources_of(TaskStatus.CANCELLED))} tasks can be cancelled",
        {"status": current.status},
    )


def task_delete(*, task_id: uuid.UUID | str) -> None:
    """Delete a task in a final state, with its runs, logs and signals."""
    task_id = _uuid(task_id)
    with connection.cursor() as cursor:
        cursor.execute(lifecycle.DELETE_FINAL_TASK, {"id": task_id})
        deleted = cursor.fetchone()
    if deleted:
        return
    current = selectors.task_get(task_id=task_id)
    raise InvalidState(
        f"task {task_id} is {current.status}; only finished tasks "
        f"({', '.join(sorted(FINAL_STATES))}) can be deleted",
        {"status": current.status},
    )


def dead_letter_tasks(*, task_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """RETRY tasks with no attempts left → DEAD_LETTER with their rows. Returns the ids moved."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(lifecycle.DEAD_LETTER_TASKS, {"ids": task_ids})
        return [row[0] for row in cursor.fetchall()]


def dead_letter_replay(*, dead_letter_id: uuid.UUID | str) -> Task:
    """A new PENDING task with the dead letter's task_name, queue, input, metadata, priority,
    max_retries and timeout.

    The new task records the dead letter (and the original task) it came from; the dead letter
    records when it was replayed and into which task. Two replays of one letter racing each
    other make one task: the second, finding the letter replayed since it read it, answers
    with the first's task (lifecycle.CLAIM_DEAD_LETTER_REPLAY). A replay asked for later, by
    someone who saw the first, is a replay again.
    """
    letter = selectors.dead_letter_get(dead_letter_id=dead_letter_id)
    spec = _replay_spec(task_name=letter.task_name, queue=letter.queue, input=letter.input,
                        metadata=letter.metadata, max_retries=letter.max_retries,
                        timeout_seconds=letter.timeout_seconds, priority=letter.priority or 0,
                        concurrency_key=letter.concurrency_key)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(lifecycle.CLAIM_DEAD_LETTER_REPLAY, {"id": letter.id, "seen": letter.replay_count})
        if cursor.fetchone() is None:  # replayed meanwhile (or deleted): that replay's task answers
            letter = selectors.dead_letter_get(dead_letter_id=letter.id)
            if letter.replay_task_id is None:
                raise InvalidState("the dead letter is being replayed concurrently; retry the request")
            return Task.objects.get(id=letter.replay_task_id)
        ((task, _),) = _create([spec], {"replayed_from_task_id": letter.task_id,
                                        "replayed_from_dead_letter_id": letter.id})
        cursor.execute(lifecycle.SET_DEAD_LETTER_REPLAY_TASK, {"id": letter.id, "task_id": task.id})
    return task


def task_replay(*, task_id: uuid.UUID | str) -> Task:
    """Replay a DEAD_LETTER, FAILED or CANCELLED task as a new PENDING task."""
    original = selectors.task_get(task_id=task_id)
    if original.status not in REPLAYABLE:
        raise InvalidState(
            f"task {original.id} is {original.status}; only {', '.join(REPLAYABLE)} tasks can be replayed",
            {"status": original.status},
        )
    letter = DeadLetter.objects.filter(task_id=original.id).only("id").first()
    return _replay(
        task_name=original.task_name, queue=original.queue, input=original.input,
        metadata=original.metadata, max_retries=original.max_retries,
        timeout_seconds=original.timeout_seconds, priority=original.priority,
        concurrency_key=original.concurrency_key, replayed_from_task_id=original.id,
        replayed_from_dead_letter_id=letter.id if letter else None,
    )


def _replay_spec(*, task_name: str, queue: str, input: Any, metadata: Any, max_retries: int | None,
                 timeout_seconds: int | None, priority: int, concurrency_key: str | None) -> TaskSpec:
    return parse_task_spec({
        "task_name": task_name, "queue": queue, "input": input, "metadata": metadata or {},
        "max_retries": max_retries, "timeout_seconds": timeout_seconds, "priority": priority,
        "concurrency_key": concurrency_key,
    })


def _replay(*, task_name: str, queue: str, input: Any, metadata: Any, max_retries: int | None,
            timeout_seconds: int | None, priority: int, concurrency_key: str | None, replayed_from_task_id: Any,
            replayed_from_dead_letter_id: Any) -> Task:
    spec = _replay_spec(task_name=task_name, queue=queue, input=input, metadata=metadata,
                        max_retries=max_retries, timeout_seconds=timeout_seconds, priority=priority,
                        concurrency_key=concurrency_key)
    with transaction.atomic():
        ((task, _),) = _create([spec], {"replayed_from_task_id": replayed_from_task_id,
                                        "replayed_from_dead_letter_id": replayed_from_dead_letter_id})
        if replayed_from_dead_letter_id is not None:
            with connection.cursor() as cursor:
                cursor.execute(lifecycle.MARK_DEAD_LETTER_REPLAYED,
                               {"id": replayed_from_dead_letter_id, "task_id": task.id})
    return task


def _uuid(value: uuid.UUID | str) -> uuid.UUID:
    return selectors.parse_id(value, what="task")


def queue_pause(*, name: str, until: Any = None) -> Queue:
    """Pause a queue: no dispatcher starts its tasks from its next claim on (within a second);
    running ones carry on, and new ones are still taken. With `until` (after now) the pause ends
    by itself then: one not after now is a VALIDATION_ERROR. NOT_FOUND for a queue without tasks,
    workers or a row."""
    until = parse_pause(None if until is None else {"until": until}, now=timezone.now())
    return _queue_write(name, queues_sql.PAUSE_QUEUE, {"paused": True, "until": until})


def queue_pause_from_data(*, name: str, data: Any) -> Queue:
    """`queue_pause` for a request body: none, or {"until": RFC 3339}."""
    return queue_pause(name=name, until=parse_pause(data, now=timezone.now()))


def queue_resume(*, name: str) -> Queue:
    """End a queue's pause; the dispatchers claim from it at once."""
    return _queue_write(name, queues_sql.PAUSE_QUEUE, {"paused": False, "until": None})


def queue_update(*, name: str, data: Any) -> Queue:
    """Change a queue's limits and description (`tasks.specs.parse_queue_changes`: a bad value
    writes nothing). The dispatchers claim within the new limits from their next claim on."""
    changes = parse_queue_changes(data)
    if not changes:
        return selectors.queue_get(name=name).queue
    assignments = [f"{column} = %({column})s" for column in changes]  # columns of QUEUE_SETTINGS only
    if "rate_limit" in changes and changes["rate_limit"] is None:
        assignments.append(queues_sql.CLEAR_RATE_WINDOW)
    if "max_running_per_key" in changes and changes["max_running_per_key"] is None:
        assignments.append(queues_sql.CLEAR_KEY_TURN)
    return _queue_write(name, queues_sql.UPDATE_QUEUE.format(assignments=", ".join(assignments)), changes)


def _queue_write(name: str, statement: str, params: dict[str, Any]) -> Queue:
    """Run one of the queue row's writes, after making the row of a queue that has tasks or
    workers and none yet; NOT_FOUND when there is no row to write."""
    name = selectors.queue_name(name)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queues_sql.ENSURE_QUEUE, {"name": name})
        rows = list(Queue.objects.raw(statement, {**params, "name": name}))
    if not rows:
        raise NotFound(f"queue {name} not found")
    return rows[0]
