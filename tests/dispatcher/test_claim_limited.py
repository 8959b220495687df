"""The claims of queues with controls (dispatcher/sql.py CLAIM_LIMITED) on a real PostgreSQL: pause,
max_running under concurrent claimers, the rate window, and keys taking turns."""

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction

from dispatcher import sql
from tasks import services
from tasks.models import Queue, Task
from tasks.services import task_enqueue_many
from tests.helpers import database_url, db_now

pytestmark = pytest.mark.django_db(transaction=True)


def claim(queue: str, limit: int, node: str = "test-node") -> tuple[list[str], tuple]:
    """One limited claim: the ids claimed and (state, held, retry_in, again)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.LOCK_QUEUE, {"queue": queue})
        cur.execute(sql.CLAIM_LIMITED, {"queue": queue, "limit": limit, "node_id": node})
        *rows, answer = cur.fetchall()
    return [row[0] for row in rows], tuple(answer[9:13])


def keys_of(ids: list[str]) -> list[str | None]:
    by_id = dict(Task.objects.filter(id__in=ids).values_list("id", "concurrency_key"))
    return [by_id[i] for i in map(__import__("uuid").UUID, ids)]


def start(ids: list[str] | None = None) -> None:
    """DISPATCHING → RUNNING, as the writer's START_RUNS does (the rate window sees it)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE tasks SET status = 'RUNNING', started_at = now(), attempt_count = 1 "
                    "WHERE status = 'DISPATCHING' AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))",
                    {"ids": ids})


def finish(n: int, key: str | None = None) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE tasks SET status = 'COMPLETED', finished_at = now() WHERE id IN ("
                    " SELECT id FROM tasks WHERE status IN ('DISPATCHING', 'RUNNING')"
                    " AND concurrency_key IS NOT DISTINCT FROM %s ORDER BY id LIMIT %s)", [key, n])


def enqueue(queue: str, n: int, **fields) -> list[Task]:
    return task_enqueue_many([{"task_name": "t", "queue": queue, **fields}] * n)


def settings(queue: str, **values) -> None:
    assert Queue.objects.filter(name=queue).update(**values) == 1


def test_the_plain_claim_leaves_a_queue_with_controls_alone_and_says_so():
    enqueue("ctl", 3)
    settings("ctl", max_running=1)
    with connection.cursor() as cur:
        cur.execute(sql.CLAIM, sql.claim_params(queue="ctl", limit=10, node_id="n"))
        assert cur.fetchall() == [(None,) * 9]
        settings("ctl", max_running=None, paused=True, paused_until=db_now() - timedelta(seconds=1))
        cur.execute(sql.CLAIM, sql.claim_params(queue="ctl", limit=10, node_id="n"))
        assert len(cur.fetchall()) == 3, "a pause whose end has passed holds nothing back"
    assert Task.objects.filter(status="DISPATCHING").count() == 3


def test_a_paused_queue_is_not_claimed_until_its_pause_ends():
    enqueue("p", 2)
    settings("p", paused=True)
    assert claim("p", 10) == ([], ("paused", None, None, False))
    settings("p", paused_until=db_now() + timedelta(hours=1))
    assert claim("p", 10)[0] == []
    settings("p", paused_until=db_now() - timedelta(milliseconds=1))
    ids, (state, *_) = claim("p", 10)
    assert len(ids) == 2 and state == "open"


def test_a_queue_without_a_row_is_not_claimed_by_the_limited_claim():
    enqueue("gone", 2)
    Queue.objects.filter(name="gone").delete()
    assert claim("gone", 10) == ([], ("missing", None, None, False))


def test_max_running_holds_across_claims_and_frees_as_tasks_end():
    enqueue("mr", 10)
    settings("mr", max_running=3)
    ids, answer = claim("mr", 5)
    assert len(ids) == 3 and answer == ("limited", "max_running", None, False)
    start()
    assert claim("mr", 5) == ([], ("limited", "max_running", None, False))
    finish(2)
    assert len(claim("mr", 5)[0]) == 2
    settings("mr", max_running=10)
    assert len(claim("mr", 10)[0]) == 5
    assert claim("mr", 10) == ([], ("limited", None, None, False)), "nothing left to hold back"


def test_concurrent_claimers_never_take_a_queue_past_max_running():
    """Eight connections claim at once, again and again: together they take exactly max_running."""
    enqueue("race", 200)
    settings("race", max_running=17)
    taken: list[int] = []
    barrier = threading.Barrier(8)

    def claimer() -> None:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            barrier.wait()
            for _ in range(20):
                with conn.transaction():
                    conn.execute(sql.LOCK_QUEUE, {"queue": "race"})
                    rows = conn.execute(sql.CLAIM_LIMITED, {"queue": "race", "limit": 5, "node_id": "n"}).fetchall()
                taken.append(len(rows) - 1)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 17
    assert Task.objects.filter(status="DISPATCHING").count() == 17


def _age_window(queue: str, seconds: float) -> None:
    """Move the queue's rate stamps `seconds` into the past, as if that much time had gone by."""
    with connection.cursor() as cur:
        cur.execute("UPDATE queues SET rate_stamps = ARRAY(SELECT s - make_interval(secs => %s) FROM "
                    "unnest(rate_stamps) s) WHERE name = %s", [seconds, queue])


def test_the_rate_window_counts_starts_until_they_are_a_period_old():
    enqueue("rate", 30)
    settings("rate", rate_limit=5, rate_period_seconds=10)
    first, answer = claim("rate", 8)
    assert len(first) == 5 and answer[:2] == ("limited", "rate_limit")
    # Claimed, not yet started: they count already.
    assert claim("rate", 8)[0] == []
    start(first[:3])
    ids, (_, held, retry_in, _) = claim("rate", 8)  # stamps the three starts
    # Once those three are a period old, the two yet to start (stamped later) leave room for three.
    assert ids == [] and held == "rate_limit" and 9.0 < retry_in <= 10.2
    start()
    ids, (_, held, retry_in, _) = claim("rate", 8)
    assert ids == [] and held == "rate_limit" and 9.0 < retry_in <= 10.2
    stamps, counts = Queue.objects.values_list("rate_stamps", "rate_counts").get(name="rate")
    assert sum(counts) == 5 and len(stamps) <= 2
    _age_window("rate", 9.0)
    assert claim("rate", 8)[0] == [], "the window has not moved past them yet"
    _age_window("rate", 1.2)  # stamps are at most a 64th of the period (0.16 s) after the starts
    assert len(claim("rate", 8)[0]) == 5


def test_a_window_with_room_lets_only_that_many_start():
    enqueue("room", 20)
    settings("room", rate_limit=6, rate_period_seconds=60)
    start(claim("room", 4)[0])
    ids, answer = claim("room", 4)
    assert len(ids) == 2 and answer[1] == "rate_limit"
    start()
    assert claim("room", 4)[0] == []
    assert Task.objects.filter(status="RUNNING").count() == 6


def test_the_limits_together_hold_to_the_tightest():
    enqueue("both", 20)
    settings("both", rate_limit=3, max_running=2)
    ids, answer = claim("both", 10)
    assert len(ids) == 2 and answer[1] == "max_running"
    start()
    finish(2)
    ids, answer = claim("both", 10)
    assert len(ids) == 1 and answer[1] == "rate_limit"


def test_keys_take_turns_and_each_is_held_to_its_limit():
    big = enqueue("fair", 50, concurrency_key="big")
    small = [enqueue("fair", 2, concurrency_key=f"k{i}") for i in range(5)]
    settings("fair", max_running_per_key=2)
    ids, answer = claim("fair", 6)
    assert sorted(keys_of(ids)) == ["big", "k0", "k1", "k2", "k3", "k4"], "one each before anyone's second"
    assert answer == ("limited", None, None, False)
    ids, _ = claim("fair", 6)
    assert sorted(keys_of(ids)) == ["big", "k0", "k1", "k2", "k3", "k4"]
    ids, answer = claim("fair", 6)
    assert ids == [] and answer[1] == "max_running_per_key"
    finish(2, key="big")
    assert keys_of(claim("fair", 6)[0]) == ["big", "big"]
    assert Task.objects.filter(concurrency_key="big", status="PENDING").count() == len(big) - 4
    assert all(Task.objects.filter(id__in=[t.id for t in s], status="DISPATCHING").count() == 2 for s in small)


def test_a_key_held_to_its_limit_with_room_left_in_the_claim_says_so():
    """Two keys, a claim with room for far more than their limits: the limit held each key back,
    though neither was at its limit when the claim began, and the claim says so (it once did only
    for a key already at its limit, which with few keys left most such claims uncounted)."""
    enqueue("few", 5, concurrency_key="a")
    enqueue("few", 5, concurrency_key="b")
    settings("few", max_running_per_key=2)
    ids, answer = claim("few", 100)
    assert sorted(keys_of(ids)) == ["a", "a", "b", "b"] and answer[1] == "max_running_per_key"
    finish(2, key="a")
    ids, answer = claim("few", 100)
    assert keys_of(ids) == ["a", "a"] and answer[1] == "max_running_per_key"
    finish(2, key="a")
    ids, answer = claim("few", 100)
    assert keys_of(ids) == ["a"] and answer[1] == "max_running_per_key", "a's last task, and b at its limit"
    finish(2, key="b")
    ids, answer = claim("few", 100)
    assert keys_of(ids) == ["b", "b"] and answer[1] == "max_running_per_key", "one left behind"


def test_a_key_that_fits_its_room_is_not_held():
    enqueue("fits", 2, concurrency_key="a")
    settings("fits", max_running_per_key=2)
    ids, answer = claim("fits", 100)
    assert keys_of(ids) == ["a", "a"] and answer == ("limited", None, None, False)


def test_the_turn_goes_round_every_key_before_any_comes_again():
    for i in range(40):
        enqueue("round", 3, concurrency_key=f"key-{i:02d}")
    settings("round", max_running_per_key=5)
    served: list[str] = []
    for _ in range(10):
        ids, _ = claim("round", 4)
        served += sorted(keys_of(ids))
    assert served == [f"key-{i:02d}" for i in range(40)], "each claim starts after the key served last"


def test_tasks_without_a_key_take_a_turn_too():
    enqueue("mixed", 5, concurrency_key="a")
    enqueue("mixed", 5)
    settings("mixed", max_running_per_key=1)
    assert sorted(keys_of(claim("mixed", 4)[0]), key=str) == [None, None, None, "a"]


def test_a_key_with_fewer_tasks_than_its_share_leaves_a_claim_short_and_says_claim_again():
    enqueue("short", 1, concurrency_key="a")
    enqueue("short", 20, concurrency_key="b")
    settings("short", max_running_per_key=20)
    ids, answer = claim("short", 10)
    assert sorted(keys_of(ids)) == ["a"] + ["b"] * 5 and answer[3] is True
    ids, answer = claim("short", 4)
    assert keys_of(ids) == ["b"] * 4


def test_a_rate_limit_set_on_a_queue_claimed_by_key_counts_no_earlier_claims_as_starts():
    enqueue("later", 10, concurrency_key="k")
    settings("later", max_running_per_key=5)
    assert len(claim("later", 10)[0]) == 5
    start()
    finish(5, key="k")
    services.queue_update(name="later", data={"rate_limit": 2, "rate_period_seconds": 3600})
    assert len(claim("later", 10)[0]) == 2, "nothing started in the last hour: the window has room for 2"
    start()
    assert claim("later", 10)[0] == []
