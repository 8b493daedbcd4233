"""Whether the platform answers: the requests waiting for it, and how long.

A platform that refuses a connection fails at once, and the run's backoff
says so. One that takes the connection and never answers (a black-holed
address, a proxy that hangs) would hold the delivery thread for a whole read
timeout (a minute, five for an upload) per attempt, with nothing said
meanwhile: the eval runs on, and its end waits for a platform that will
never answer. So every request to the platform is timed here, and once one
has waited ``UNANSWERED_SECONDS`` without any answer the listeners (the
uploaders of this process) are told, once per silence, while the request
still waits; and told again when an answer comes.

One watch per process (:data:`WATCH`): every uploader in it talks to the
same platform through the same network.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

#: A request unanswered this long means the platform cannot be reached now.
UNANSWERED_SECONDS = 5.0


class SilenceListener(Protocol):
    def platform_silent(self, what: str, seconds: float) -> None:
        """A request (``what``, e.g. ``POST /evaluations/``) has waited
        ``seconds`` without an answer."""

    def platform_answers(self) -> None:
        """An answer came after a silence."""


class PlatformWatch:
    def __init__(self, after: float = UNANSWERED_SECONDS) -> None:
        self.after = after
        self._reset()

    def _reset(self) -> None:
        self._state = threading.Condition(threading.Lock())
        self._waiting: dict[int, tuple[float, str]] = {}
        self._tokens = 0
        self._listeners: list[SilenceListener] = []
        self._silent = False
        self._thread: threading.Thread | None = None
        #: When the platform last answered anything (``time.time()``), if ever.
        self.last_answer: float | None = None

    @property
    def silent(self) -> bool:
        """Whether a request has waited past ``after`` since the last answer."""
        return self._silent

    def answered_since(self, when: float) -> bool:
        """Whether the platform answered anything (even a refusal) in this
        process since ``when`` (``time.time()``)."""
        last = self.last_answer
        return last is not None and last >= when

    def add(self, listener: SilenceListener) -> None:
        with self._state:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def remove(self, listener: SilenceListener) -> None:
        with self._state:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Around one request to the platform; an answer (of any status)
        ends the silence, a transport error does not."""
        with self._state:
            self._tokens += 1
            token = self._tokens
            self._waiting[token] = (time.monotonic(), what)
            self._start_thread()
            self._state.notify_all()
        try:
            yield
        finally:
            with self._state:
                self._waiting.pop(token, None)

    def answered(self) -> None:
        """The platform answered a request (whatever it said)."""
        with self._state:
            self.last_answer = time.time()
            was_silent, self._silent = self._silent, False
            listeners = list(self._listeners) if was_silent else []
        for listener in listeners:
            listener.platform_answers()

    def _start_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(
            target=self._watch, name="prime-runs-otel-platform-watch", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        while True:
            with self._state:
                while not self._waiting or self._silent:
                    self._state.wait(1.0)
                started, what = min(self._waiting.values())
                waited = time.monotonic() - started
                if waited < self.after:
                    self._state.wait(self.after - waited)
                    continue
                self._silent = True
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener.platform_silent(what, waited)
                except Exception:  # a listener's failure must not end the watch
                    continue


WATCH = PlatformWatch()
# A forked child starts with no request waiting, and no watching thread.
os.register_at_fork(after_in_child=WATCH._reset)
