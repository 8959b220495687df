"""The retry policy: how many times a task runs and how long it waits between tries.

A task runs at most `max_retries + 1` times. After failed attempt k
(k = 1..max_retries) the next attempt waits `base × 2^(k−1)`, spread by
random jitter within ±`jitter` (25% by default) so a burst of failures does
not come back as a burst, and never more than `cap`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    base_delay: float = 1.0
    max_delay: float = 3600.0
    jitter: float = 0.25

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        from valka.conf import valka_settings

        return cls(
            base_delay=valka_settings.RETRY_BASE_DELAY,
            max_delay=valka_settings.RETRY_MAX_DELAY,
            jitter=valka_settings.RETRY_JITTER,
        )

    def nominal_delay(self, attempt: int) -> float:
        """The delay after failed attempt `attempt` before jitter, capped."""
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        # Cap the exponent first so a huge attempt number cannot overflow.
        exponent = min(attempt - 1, 62)
        return min(self.max_delay, self.base_delay * (2.0**exponent))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt `attempt`, jittered, never above the cap."""
        return self.delay_for(attempt, (rng or random).random())

    def delay_for(self, attempt: int, u: float) -> float:
        """The delay for a given uniform random draw `u` in [0, 1).

        `valka_retry_delay()` in PostgreSQL computes exactly this (a test holds
        them equal), so batch statements apply the same policy without a round
        trip to Python.
        """
        factor = 1.0 + self.jitter * (2.0 * u - 1.0)
        return min(self.max_delay, max(0.0, self.nominal_delay(attempt) * factor))

    def sql_params(self) -> dict[str, float]:
        return {"retry_base": self.base_delay, "retry_cap": self.max_delay, "retry_jitter": self.jitter}


def retries_left(attempt_count: int, max_retries: int) -> bool:
    """Whether a task that has started `attempt_count` attempts may run again."""
    return attempt_count < max_retries + 1
