"""Status changes asked for by people and programs: cancel, delete, dead-letter, replay.

Every statement is a guarded update from `tasks.states`; a statement that
returns no row lost its race (or the task was never in a state that allows
the move), and the caller reports that instead of guessing.
"""

from tasks.notify import TASK_CANCELLED
from tasks.states import FINAL_STATES, TaskStatus, ended_at, guarded_update

# -- Cancel one task (PENDING, DISPATCHING or RUNNING) and close its live run. --
# The live run is locked before the task, the same order as the statements that close runs
# (tasks.sql.outcomes), so a cancel racing a result waits instead of deadlocking.
# The NOTIFY tells the dispatcher holding a RUNNING task to stop its worker.
# A closed run ends at tasks.states.ended_at(), as every statement that closes runs says.
CANCEL_TASK = f"""
WITH live_run AS (
    SELECT id FROM task_runs WHERE task_id = %(id)s AND finished_at IS NULL AND status = 'RUNNING' FOR UPDATE
), moved AS (
    {guarded_update(TaskStatus.CANCELLED, where="id = %(id)s AND (SELECT count(*) FROM live_run) >= 0",
                    set="error_message = COALESCE(%(reason)s, error_message)",
                    returning="*")}
), runs AS (
    UPDATE task_runs SET status = 'CANCELLED', finished_at = {ended_at()}, error_message = %(reason)s
    WHERE task_id IN (SELECT id FROM moved) AND status = 'RUNNING'
    RETURNING id
)
SELECT moved.*, (SELECT count(*) FROM (SELECT pg_notify('{TASK_CANCELLED}', moved.id::text)) n) AS notified
FROM moved
"""

# -- After CANCEL_TASK, in its transaction: close the run a start committed while the cancel waited. --
# A dispatcher's start (DISPATCHING → RUNNING with its run row) that held the task when the cancel
# came commits first; CANCEL_TASK then moves the task, but its snapshot, taken before the start
# committed, cannot see the new run. This statement, with a snapshot of its own, can. A run held
# by someone else right now (a result being written) is skipped rather than waited for: locking
# it after the task would invert the order of the statements that close runs, and its closer
# finds the task CANCELLED and leaves it so. Such a run started after this transaction's now().
CLOSE_RUN_OF_CANCELLED = f"""
WITH live_run AS (
    SELECT r.id FROM task_runs r JOIN tasks t ON t.id = r.task_id
    WHERE r.task_id = %(id)s AND r.finished_at IS NULL AND r.status = 'RUNNING' AND t.status = 'CANCELLED'
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE task_runs SET status = 'CANCELLED', finished_at = {ended_at()}, error_message = %(reason)s
WHERE id IN (SELECT id FROM live_run)
RETURNING id
"""

# -- Delete a task in a final state (runs, logs and signals go with it by FK cascade). --
DELETE_FINAL_TASK = f"""
DELETE FROM tasks WHERE id = %(id)s
AND status IN ({", ".join(f"'{s.value}'" for s in sorted(FINAL_STATES))})
RETURNING id
"""

# -- RETRY tasks with no attempts left → DEAD_LETTER, with their dead-letter rows, in one statement. --
DEAD_LETTER_TASKS = f"""
WITH moved AS (
    {guarded_update(TaskStatus.DEAD_LETTER, where="id = ANY(%(ids)s) AND attempt_count > max_retries",
                    returning="*")}
), letters AS (
    INSERT INTO dead_letter_queue (id, task_id, task_name, queue, input, metadata, error_message,
                                   attempt_count, priority, max_retries, timeout_seconds, concurrency_key,
                                   created_at, replay_count)
    SELECT valka_uuid7(), id, task_name, queue, input, metadata, error_message, attempt_count,
           priority, max_retries, timeout_seconds, concurrency_key, now(), 0
    FROM moved
    ON CONFLICT (task_id) DO NOTHING
    RETURNING task_id
)
SELECT moved.id FROM moved
"""

# -- Claim the next replay of a dead letter: only if nobody replayed it since the caller read
# %(seen)s replays (a guarded update: a replay racing this one waits on the row, then finds the
# count moved and creates nothing). --
CLAIM_DEAD_LETTER_REPLAY = """
UPDATE dead_letter_queue SET replayed_at = now(), replay_count = replay_count + 1
WHERE id = %(id)s AND replay_count = %(seen)s
RETURNING id
"""

# -- The task a claimed replay created, on its dead letter. --
SET_DEAD_LETTER_REPLAY_TASK = """
UPDATE dead_letter_queue SET replay_task_id = %(task_id)s WHERE id = %(id)s
"""

# -- Record a replay of a task on its dead letter (a replay of the task itself, not of the letter). --
MARK_DEAD_LETTER_REPLAYED = """
UPDATE dead_letter_queue
SET replayed_at = now(), replay_task_id = %(task_id)s, replay_count = replay_count + 1
WHERE id = %(id)s
RETURNING id
"""
