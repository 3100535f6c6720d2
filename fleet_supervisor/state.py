"""The states of one supervised child, with the contract of each transition (supervisord names).

::

    STOPPED ──start──▶ STARTING ──/health 200──▶ RUNNING
                          │  exit / startup timeout      │  exit / N failed probes
                          ▼                              ▼
                        EXITED ◀─────────────────────────┘
                          │  group empty
                          ├── rapid failures <= start_retries ──▶ BACKOFF ──delay──▶ STARTING
                          └── rapid failures  > start_retries ──▶ FATAL (stays down)
    any live state ──stop requested──▶ STOPPING ──group empty──▶ STOPPED

    Instances with a ``sleep:`` block (fleetspec/sleep.py) also move through these:

    RUNNING ──sleep asked──▶ DRAINING ──every gateway idle on it──▶ SLEEPING ──wake asked──▶ WAKING ──▶ RUNNING
                               │ the engine died / a restart was asked       │ died        │ failed / timed out
                               └──────────────────────────────▶ EXITED ◀─────┴─────────────┘
    STOPPED ──cold, not preloaded──▶ SLEEPING (never started until a request wants it)

Contracts:

- STOPPED → STARTING: a new process group is spawned; nothing of a previous run is alive.
- STARTING → RUNNING: ``GET /health`` answered 200 before ``startup_timeout_s`` ran out.
- STARTING → EXITED: the process exited, could not be spawned, or the startup deadline passed.
- RUNNING → EXITED: the process exited, or ``health_failures`` probes in a row failed.
- EXITED: the group is being stopped (SIGTERM, grace, SIGKILL); the state is left only once the
  group is empty, so a restart never races leftover EngineCore/TP workers for GPU memory.
- EXITED → BACKOFF: the failure was counted; the next start waits an exponential delay.
  A run that stayed RUNNING for ``start_secs`` resets the count of rapid failures first.
- EXITED → FATAL: more than ``start_retries`` rapid failures in a row. FATAL is final for the life
  of the supervisor: the instance stays down and shows as FATAL in status and metrics.
- BACKOFF → STARTING: the delay passed; the restart counter goes up by one.
- STARTING/RUNNING/BACKOFF/EXITED → STOPPING: a stop was requested (Ctrl-C, SIGTERM).
- STOPPING → STOPPED: the group is empty.
- RUNNING → DRAINING: a sleep (or a planned stop) was asked. Gateways stop sending new requests;
  those in flight finish. Never cut: the drain waits for them.
- DRAINING → SLEEPING: every connected gateway acknowledged the drain for this epoch and the
  engine reports nothing running or waiting; then vLLM's ``POST /sleep`` succeeded (mode vllm) or
  the group is empty (mode cold). From here the instance holds no budget.
- DRAINING → RUNNING: the drain was called off (the instance is wanted again before it slept).
- SLEEPING → WAKING: a wake was asked and the swap policy gave it budget.
- WAKING → RUNNING: vLLM says it is no longer sleeping (mode vllm: ``wake_up``, for level 2 also
  ``reload_weights`` and ``reset_prefix_cache``) or ``/health`` is 200 (mode cold: started again).
- WAKING → EXITED: the wake failed or passed ``sleep.wake_timeout_s``: the group is stopped and the
  instance restarts cold, so a wake is never left half done.
- SLEEPING/DRAINING → EXITED: the process died; the usual restart path follows.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    EXITED = "EXITED"
    FATAL = "FATAL"
    DRAINING = "DRAINING"
    SLEEPING = "SLEEPING"
    WAKING = "WAKING"


# One owner (the instance's lifecycle loop) moves the state, and only along these edges; a move
# outside them is a bug in the loop, not an event to tolerate.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.STARTING, State.SLEEPING}),
    State.STARTING: frozenset({State.RUNNING, State.EXITED, State.STOPPING}),
    State.RUNNING: frozenset({State.EXITED, State.STOPPING, State.DRAINING}),
    State.EXITED: frozenset({State.BACKOFF, State.FATAL, State.STOPPING}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPING}),
    State.STOPPING: frozenset({State.STOPPED}),
    State.FATAL: frozenset(),
    State.DRAINING: frozenset({State.SLEEPING, State.RUNNING, State.EXITED, State.STOPPING}),
    State.SLEEPING: frozenset({State.WAKING, State.EXITED, State.STOPPING}),
    State.WAKING: frozenset({State.RUNNING, State.EXITED, State.STOPPING}),
}


class TransitionError(RuntimeError):
    """The lifecycle loop tried to move along an edge that the table above does not have."""


def check_transition(old: State, new: State) -> None:
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"illegal state transition {old.value} -> {new.value}")


def is_up(state: State) -> bool:
    """States in which a process of the instance may be alive (SLEEPING: in mode vllm)."""
    return state in (State.STARTING, State.RUNNING, State.EXITED, State.STOPPING, State.DRAINING, State.SLEEPING,
                     State.WAKING)
