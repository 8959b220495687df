import random

import pytest

from tasks.retry import RetryPolicy, retries_left


def test_nominal_delays_double():
    policy = RetryPolicy(base_delay=1.0, max_delay=3600, jitter=0.25)
    assert [policy.nominal_delay(k) for k in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8])
def test_jitter_stays_within_a_quarter(attempt):
    policy = RetryPolicy(base_delay=1.0, max_delay=10_000, jitter=0.25)
    rng = random.Random(attempt)
    delays = [policy.delay(attempt, rng) for _ in range(2000)]
    nominal = 2 ** (attempt - 1)
    assert min(delays) >= nominal * 0.75 and max(delays) <= nominal * 1.25
    # Real spread, not a constant: both halves of the band are used.
    assert min(delays) < nominal * 0.8 and max(delays) > nominal * 1.2


def test_cap_bounds_the_delay_even_with_jitter():
    policy = RetryPolicy(base_delay=1.0, max_delay=60, jitter=0.25)
    rng = random.Random(1)
    assert all(policy.delay(20, rng) <= 60 for _ in range(500))
    assert policy.nominal_delay(1000) == 60  # no overflow for absurd attempt numbers


def test_attempt_numbers_start_at_one():
    with pytest.raises(ValueError):
        RetryPolicy().nominal_delay(0)


@pytest.mark.parametrize(("attempts", "max_retries", "left"), [
    (0, 3, True), (1, 3, True), (3, 3, True), (4, 3, False), (5, 3, False), (0, 0, True), (1, 0, False),
])
def test_a_task_runs_at_most_max_retries_plus_one_times(attempts, max_retries, left):
    assert retries_left(attempts, max_retries) is left


def test_defaults_come_from_settings(settings):
    settings.VALKA = {**settings.VALKA, "RETRY_BASE_DELAY": 2.0, "RETRY_MAX_DELAY": 30.0, "RETRY_JITTER": 0.1}
    assert RetryPolicy.from_settings() == RetryPolicy(base_delay=2.0, max_delay=30.0, jitter=0.1)


@pytest.mark.django_db
@pytest.mark.parametrize("policy", [RetryPolicy(), RetryPolicy(base_delay=0.5, max_delay=40.0, jitter=0.5)])
def test_postgresql_computes_the_same_delays(policy):
    """valka_retry_delay (tasks/sql/schema/retry.sql), which the batch statements use, is delay_for."""
    from django.db import connection

    cases = [(attempt, u) for attempt in (1, 2, 3, 7, 20, 63, 64, 1000) for u in (0.0, 0.25, 0.5, 0.999)]
    with connection.cursor() as cursor:
        for attempt, u in cases:
            cursor.execute("SELECT valka_retry_delay(%s, %s, %s, %s, %s)",
                           [attempt, policy.base_delay, policy.max_delay, policy.jitter, u])
            assert cursor.fetchone()[0] == pytest.approx(policy.delay_for(attempt, u), rel=1e-12), (attempt, u)
