"""The transition table, exhaustively, and the guarded compare-and-set on a real database."""

import itertools
import threading

import psycopg
import pytest
from django.db import connection

from tasks.errors import InvalidState
from tasks.models import Task
from tasks.states import FINAL_STATES, TaskStatus, can_transition, check_transition, guarded_update, sources_of
from tests.factories import TaskFactory
from tests.helpers import database_url

S = TaskStatus
ALLOWED = {
    (S.PENDING, S.DISPATCHING), (S.DISPATCHING, S.RUNNING), (S.RUNNING, S.COMPLETED), (S.RUNNING, S.FAILED),
    (S.RUNNING, S.RETRY), (S.RETRY, S.PENDING), (S.RETRY, S.DEAD_LETTER), (S.PENDING, S.CANCELLED),
    (S.DISPATCHING, S.CANCELLED), (S.RUNNING, S.CANCELLED), (S.DISPATCHING, S.PENDING),
}
PAIRS = list(itertools.product(S, S))


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_table(source, target):
    assert can_transition(source, target) == ((source, target) in ALLOWED)
    if (source, target) in ALLOWED:
        check_transition(source, target)
    else:
        with pytest.raises(InvalidState):
            check_transition(source, target)


def test_final_states():
    assert FINAL_STATES == {S.COMPLETED, S.FAILED, S.DEAD_LETTER, S.CANCELLED}
    for final in FINAL_STATES:
        assert not any(can_transition(final, t) for t in S)


def test_guarded_update_refuses_illegal_sources_when_built():
    with pytest.raises(ValueError):
        guarded_update(S.COMPLETED, where="true", sources=[S.PENDING])
    with pytest.raises(ValueError):
        guarded_update(S.PENDING, where="true", sources=[])


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_guarded_update_in_database(source, target):
    """Every pair against a real row: the row moves exactly when the table allows it."""
    task = TaskFactory(status=source.value)
    sql = guarded_update(target, where="id = %(id)s")
    with connection.cursor() as cursor:
        cursor.execute(sql, {"id": task.id})
        moved = cursor.fetchall()
    task.refresh_from_db()
    if (source, target) in ALLOWED:
        assert len(moved) == 1 and task.status == target
        assert (task.finished_at is not None) == (target in FINAL_STATES)
    else:
        assert moved == [] and task.status == source


def test_guarded_update_through_a_status_takes_two_legal_steps_only():
    """A start and its end written as one change (dispatcher/sql.py START_COMPLETED_RUNS)."""
    sql = guarded_update(S.COMPLETED, where="true", sources=[S.DISPATCHING], through=S.RUNNING)
    assert "IN ('DISPATCHING')" in sql and "status = 'COMPLETED'" in sql
    with pytest.raises(ValueError):  # PENDING → RUNNING is no step
        guarded_update(S.COMPLETED, where="true", sources=[S.PENDING], through=S.RUNNING)
    with pytest.raises(ValueError):  # RUNNING → PENDING is no step
        guarded_update(S.PENDING, where="true", sources=[S.DISPATCHING], through=S.RUNNING)
    with pytest.raises(ValueError):  # without `through`, DISPATCHING → COMPLETED stays illegal
        guarded_update(S.COMPLETED, where="true", sources=[S.DISPATCHING])


def test_sources_of_matches_table():
    for target in S:
        assert set(sources_of(target)) == {a for a, b in ALLOWED if b == target}


@pytest.mark.django_db(transaction=True)
def test_compare_and_set_two_concurrent_writers():
    """Two connections race to move one PENDING task to two different states: exactly one wins."""
    task = TaskFactory(status="PENDING")
    url = database_url()
    claim = guarded_update(S.DISPATCHING, where="id = %(id)s")
    cancel = guarded_update(S.CANCELLED, where="id = %(id)s")
    results = {}
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        results["claim"] = first.execute(claim, {"id": task.id}).fetchall()  # holds the row lock
        blocked = threading.Thread(
            target=lambda: results.__setitem__("cancel", second.execute(cancel, {"id": task.id}).fetchall())
        )
        blocked.start()
        blocked.join(0.3)
        assert blocked.is_alive(), "the second writer must wait for the first one's row lock"
        first.commit()
        blocked.join(5)
        second.commit()
    # After the claim commits, the cancel re-checks its guard against DISPATCHING, which allows it:
    # both moves are legal in sequence, and neither was lost.
    assert len(results["claim"]) == 1 and len(results["cancel"]) == 1
    assert Task.objects.get(id=task.id).status == "CANCELLED"


@pytest.mark.django_db(transaction=True)
def test_compare_and_set_loser_changes_nothing():
    """Two dispatchers claim the same task at once: the second finds it no longer PENDING."""
    task = TaskFactory(status="PENDING")
    url = database_url()
    claim = guarded_update(S.DISPATCHING, where="id = %(id)s", sources=[S.PENDING])
    results = {}
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        results["a"] = first.execute(claim, {"id": task.id}).fetchall()
        racer = threading.Thread(target=lambda: results.__setitem__("b", second.execute(claim, {"id": task.id})
                                                                     .fetchall()))
        racer.start()
        racer.join(0.3)
        first.commit()
        racer.join(5)
        second.commit()
    assert len(results["a"]) == 1 and results["b"] == []
    assert Task.objects.get(id=task.id).status == "DISPATCHING"
