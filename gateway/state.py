"""The states of one backend as the gateway sees it, who may move it, and along which edges.

Three writers move a backend's state, and nothing else does (docs/architecture.md §2):

- **probes** (health.py): the answer of ``GET /health``.
- **request outcomes** (ejection.py): failed requests in a row eject a healthy backend.
- **the supervisor** (control.py): what the instance's owner says it is doing: sleeping, waking,
  draining, back up. Only present when the gateway runs under ``vllm-fleet up``.

::

    UNKNOWN ──good probe──▶ HEALTHY ──N bad probes──▶ UNHEALTHY ──M good probes──▶ HEALTHY
                              │ failed requests                ▲
                              ▼                                │ N bad probes (from any probe state)
                            EJECTED ──good probe after the period──▶ HEALTHY

    any ──supervisor: SLEEPING/WAKING──▶ ASLEEP ──supervisor: RUNNING──▶ UNKNOWN (probed at once)
    any ──supervisor: DRAINING─────────▶ DRAINING ──supervisor: RUNNING again──▶ UNKNOWN

A sleeping vLLM answers ``/health`` with 200 and lets requests hang, so probes never move a backend
out of ASLEEP or DRAINING: only the supervisor does, and then to UNKNOWN, so that a probe still has
to confirm it before it takes traffic.
"""

from __future__ import annotations

from enum import StrEnum


class BackendState(StrEnum):
    UNKNOWN = "unknown"  # not probed since it (re)appeared: out of rotation
    HEALTHY = "healthy"  # in rotation
    UNHEALTHY = "unhealthy"  # probes failed
    EJECTED = "ejected"  # requests failed (passive); back only through a probe after the period
    ASLEEP = "asleep"  # the supervisor put it to sleep (or is waking it): servable, not routable
    DRAINING = "draining"  # the supervisor is taking it away: no new requests, in-flight ones finish


class Writer(StrEnum):
    PROBE = "probe"
    REQUESTS = "requests"
    SUPERVISOR = "supervisor"


S = BackendState
# The states that probes may move a backend out of (ASLEEP and DRAINING: only the supervisor).
PROBE_STATES = frozenset({S.UNKNOWN, S.HEALTHY, S.UNHEALTHY, S.EJECTED})

# (writer, old) -> the states that writer may move a backend to from ``old``.
EDGES: dict[tuple[Writer, BackendState], frozenset[BackendState]] = {
    **{(Writer.PROBE, s): frozenset({S.HEALTHY, S.UNHEALTHY}) - {s} for s in PROBE_STATES},
    (Writer.REQUESTS, S.HEALTHY): frozenset({S.EJECTED}),
    **{(Writer.SUPERVISOR, s): frozenset({S.ASLEEP, S.DRAINING, S.UNKNOWN}) - {s} for s in S},
}

# Requests go only to these.
ROUTABLE = frozenset({S.HEALTHY})
# A request for a model with a replica in one of these is not refused: it is routed, or it waits
# for a wake-up. /v1/models lists them and /ready counts them.
SERVABLE = frozenset({S.HEALTHY, S.ASLEEP})


class TransitionError(RuntimeError):
    """A writer tried a move the table above does not allow: a bug in that writer."""


def check_move(writer: Writer, old: BackendState, new: BackendState) -> None:
    if new not in EDGES.get((writer, old), frozenset()):
        raise TransitionError(f"{writer.value} may not move a backend from {old.value} to {new.value}")
