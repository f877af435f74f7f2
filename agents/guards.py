"""Run guards: a clean stop on SIGTERM/SIGINT, and the error a non-finite run stops with (the checks:
:func:`envs.describe_non_finite` for the env, :func:`agents.metrics.nonfinite_metrics` for the learner)."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger("recurrl")


class NonFiniteError(RuntimeError):
    """The env or the learner produced NaN/Inf; the message is one line for the user."""


class StopSignals:
    """Within ``with StopSignals() as stop:``, SIGTERM and SIGINT set ``stop.requested`` (the signal's
    name) instead of killing the process, so the loop can finish its step and checkpoint. A second
    signal raises ``KeyboardInterrupt`` at once. Outside the main thread nothing is installed."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            raise KeyboardInterrupt(f"second {name}")
        self.requested = name
        log.warning("%s received: finishing this step and writing a checkpoint (again to abort)", name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
