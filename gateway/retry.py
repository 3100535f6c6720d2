"""When another try may start: a number of attempts, an overall deadline, and jittered backoff.

Whether a failure may be retried at all is the proxy's rule (only before any byte reached the
client, only for failures that prove the upstream did no work). This module only answers "may the
next attempt start, and after how long a pause": full-jitter exponential backoff from tenacity
(``wait_random_exponential``: a random pause in [0, base × 2^(n-1)], capped), so that many clients
that failed together do not come back together; and never beyond ``retry_deadline_s`` after the
request arrived, counting the pause.
"""

from __future__ import annotations

import tenacity
from tenacity.wait import wait_random_exponential

from gateway.settings import GatewaySettings


class RetryPolicy:
    def __init__(self, settings: GatewaySettings) -> None:
        self.max_attempts = settings.max_attempts
        self.deadline_s = settings.retry_deadline_s
        self._wait = wait_random_exponential(multiplier=settings.retry_backoff_base_s,
                                             max=settings.retry_backoff_max_s)
        # tenacity's wait functions read a RetryCallState; one Retrying object serves as its owner.
        self._owner = tenacity.Retrying(wait=self._wait)

    def backoff(self, attempts_done: int, elapsed: float) -> float | None:
        """The pause before attempt ``attempts_done + 1``, or None when no further attempt may start.

        ``elapsed``: seconds since the request arrived."""
        if attempts_done >= self.max_attempts:
            return None
        state = tenacity.RetryCallState(self._owner, None, (), {})
        state.attempt_number = attempts_done
        pause = float(self._wait(state))
        if elapsed + pause >= self.deadline_s:
            return None
        return pause
