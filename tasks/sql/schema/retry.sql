-- The retry delay: valka_retry_delay().
--
-- The retry policy of tasks/retry.py (RetryPolicy.delay_for), for batch statements:
-- base × 2^(attempt−1), capped, times a jitter factor in [1−jitter, 1+jitter), capped again.
-- `u` is the jitter's uniform draw in [0, 1), as in delay_for: the two must agree, so change
-- them together.

CREATE OR REPLACE FUNCTION valka_retry_delay(attempt integer, base float8, cap float8, jitter float8,
                                             u float8 DEFAULT random())
RETURNS float8 AS $$
    SELECT LEAST(cap, GREATEST(0.0,
        LEAST(cap, base * power(2.0, LEAST(GREATEST(attempt, 1) - 1, 62))) * (1.0 + jitter * (2.0 * u - 1.0))))
$$ LANGUAGE sql VOLATILE PARALLEL SAFE;
