"""The hand-off from the caller's thread to a run's producer thread.

People record episodes from the thread that drives their rollouts, often one
asyncio loop with thousands of rollouts in flight, so every fraction of a
millisecond spent there is theirs. Building an episode's spans and encoding
its record costs tenths of a millisecond (milliseconds for large records), so
``Run.record_episode`` checks only what is cheap to check, puts the episode
here and returns; one thread per run takes the episodes off and does the rest.

What it keeps, and how:

- order: one queue, one thread, first in first out;
- backpressure instead of drops: the queue is bounded, and a caller that
  outruns the thread waits in :meth:`Handoff.put` until there is room. Room
  means a quarter of the queue is free, not one slot: a caller that always
  outruns the thread (a tight loop, a burst of finished rollouts) then
  sleeps once per 32 episodes instead of once per episode, and each wake-up
  is a futex call and a GIL hand-over on both threads. Measured with
  vf-eval's calls, the caller's CPU per episode went from 0.04 ms to under
  0.01 ms. (Waiting for half the queue saves little more CPU and doubles the
  longest single wait, the time the thread takes for that many episodes.);
- a run's end after its episodes: :meth:`Handoff.drain` returns once
  everything put before it has been handled;
- Ctrl-C anywhere on the caller's side: no interrupt between two steps of a
  ``put`` or a ``drain`` leaves the queue's state wrong (see :class:`_Bounded`),
  and :meth:`Handoff.close` ends in the time it is given, whatever the
  thread is doing, returning what it could not drain for the caller to count;
- fork safety: a forked child starts over with an empty queue and a thread of
  its own, started on its first ``put``; what was queued in the parent is the
  parent's to handle (its queue's locks may be held by a thread the child
  does not have);
- failures: an item whose handling raises goes to ``on_error`` and the thread
  carries on with the next one; it never dies on one bad item.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._wakeup import POLL, Wakeup

__all__ = ["DEFAULT_CAPACITY", "Handoff", "NotDrained"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Items waiting at most. Enough to absorb a burst of finished rollouts; small
#: enough that the records held while waiting stay a bounded amount of memory.
DEFAULT_CAPACITY = 128

_STOP: Any = object()

_live: weakref.WeakSet[Handoff[Any]] = weakref.WeakSet()


class _Bounded:
    """A FIFO for one consumer thread that holds at most ``capacity`` items; a
    full one lets its producers in again once it is down to ``low``, three
    quarters of it.

    ``queue.Queue`` wakes a waiting producer on every ``get``; this wakes it
    once, at the low-water mark.

    Safe against Ctrl-C in its producers and in whoever waits for the drain
    (the main thread is both): a producer's one write is a deque append, a
    single C call that an exception cannot split; what the consumer is doing
    (``_busy``) is written by the consumer thread alone, where no signal is
    ever raised; and every wait is a :class:`~prime_runs_otel._wakeup.Wakeup`
    with the real state read again after it. :meth:`join` waits for that
    state, an empty queue and an idle consumer, not for a count of puts and
    ``task_done`` calls, which an interrupt between a put and its count
    once left wrong for ever (a ``join`` that never returned).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.low = capacity * 3 // 4
        self._items: deque[Any] = deque()
        #: Set by the consumer before it takes an item, cleared once the item
        #: is handled and nothing is left: written on the consumer thread only.
        self._busy = False
        self._item_ready = Wakeup()  # for the consumer
        self._room = Wakeup()  # for producers waiting on a full queue
        self._idle = Wakeup()  # for joiners
        #: Times the consumer took the queue down to ``low``: consumer only.
        self._low_passes = 0

    def put(self, item: Any) -> None:
        items = self._items
        if len(items) >= self.capacity:
            while len(items) >= self.capacity:
                # Until the consumer passes the low-water mark; a fellow
                # producer woken with this one may have filled it up again.
                passed = self._low_passes
                while self._low_passes == passed:
                    self._room.wait(POLL)
            self._room.post()  # a fellow producer may wait for the same pass
        items.append(item)
        # Interrupted before this, the item waits for the next put or join.
        self._item_ready.post()

    def get(self, between: Callable[[], float] = lambda: POLL) -> Any:
        """On the consumer thread: the next item, waiting for one; while the
        queue is empty, ``between()`` is called before each wait and says
        how long that wait may be."""
        items = self._items
        while True:
            self._busy = True  # before the take, so join never sees neither
            try:
                item = items.popleft()
            except IndexError:
                self._busy = False
                self._idle.post()
                # A bounded wait, read again after it: a wait of no time at
                # all would spin a core for as long as the queue is empty.
                self._item_ready.wait(between())
                continue
            if len(items) == self.low:
                self._low_passes += 1
                self._room.post()
            return item

    def task_done(self) -> None:
        """On the consumer thread: the item taken last is handled."""
        self._busy = False
        if not self._items:
            self._idle.post()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every item put so far is handled; ``False`` if ``timeout``
        (seconds) passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # The queue first, then the consumer: it is busy before it takes.
        while self._items or self._busy:
            # A put interrupted after its append never woke the consumer.
            self._item_ready.post()
            wait = POLL
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return False
            self._idle.wait(wait)
        self._idle.post()  # for a fellow joiner
        return True

    def take_all(self) -> list[Any]:
        """The items still queued, taken off so that nobody handles them."""
        taken = []
        while True:
            try:
                taken.append(self._items.popleft())
            except IndexError:
                return taken

    @property
    def busy(self) -> bool:
        """Whether the consumer holds an item now."""
        return self._busy


@dataclass(frozen=True)
class NotDrained(Generic[T]):
    """What :meth:`Handoff.close` could not drain in its time: the items it
    took off the queue unhandled, and whether the thread was still handling
    one (which may yet be handled, or never)."""

    items: list[T]
    in_hand: bool

    @property
    def count(self) -> int:
        return len(self.items) + int(self.in_hand)


class Handoff(Generic[T]):
    """A bounded queue drained in order by one daemon thread that calls
    ``handle(item)``; ``on_error(item, exc)`` when that raises.

    ``between()``, when given, is the thread's own work besides the items
    (a run's producer exports its span batches there): called after each
    item, and before each wait while the queue is empty, it returns the
    longest that wait may be. What it raises is logged; the thread goes on.

    :attr:`handled` and :attr:`failed` count, on the thread, the items
    ``handle`` returned from and those it raised on: what really happened to
    them, whatever the callers of :meth:`put` counted."""

    def __init__(
        self,
        handle: Callable[[T], None],
        on_error: Callable[[T, BaseException], None],
        *,
        capacity: int = DEFAULT_CAPACITY,
        name: str = "prime-runs-otel-producer",
        between: Callable[[], float] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more, not {capacity}")
        self._handle = handle
        self._on_error = on_error
        self._between = between or _no_work_between
        self._capacity = capacity
        self._name = name
        self.handled = 0
        self.failed = 0
        self._fresh()
        _live.add(self)
        # Started now, not on the first put: a thread start that Ctrl-C cut
        # short on the caller's first episode could leave no thread at all.
        self._start()

    def _fresh(self) -> None:
        self._queue = _Bounded(self._capacity)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    def put(self, item: T) -> None:
        """Queue ``item``, waiting while the queue is full (backpressure)."""
        if self._thread is None:
            self._start()  # in a forked child
        self._queue.put(item)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, args=(self._queue,), name=self._name, daemon=True
                )
                thread.start()
                self._thread = thread

    def drain(self, timeout: float | None = None) -> bool:
        """Return once every item put so far has been handled (``True``), or
        once ``timeout`` seconds have passed (``False``)."""
        if self._thread is None:
            return True  # a forked child that put nothing yet
        return self._queue.join(timeout)

    def close(self, timeout: float | None = None) -> NotDrained[T] | None:
        """Drain, then let the thread end. Nothing may be put afterwards.

        Bounded by ``timeout``: what is still queued then is taken off and
        returned unhandled (with whether the thread still held an item), for
        the caller to count; ``None`` when everything was handled."""
        drained = self.drain(timeout)
        if self._closed:
            return None
        self._closed = True
        left = None
        if not drained:
            left = NotDrained(self._queue.take_all(), self._queue.busy)
            if not left.count:
                left = None
        if self._thread is not None:
            # The thread ends on it once it is done with what it holds.
            self._queue.put(_STOP)
        return left

    def _run(self, items: _Bounded) -> None:
        between = self._guarded_between
        while True:
            item = items.get(between)
            try:
                if item is _STOP:
                    return
                try:
                    self._handle(item)
                except BaseException as exc:  # the thread outlives one bad item
                    self.failed += 1
                    self._report(item, exc)
                else:
                    self.handled += 1
                between()
            finally:
                items.task_done()

    def _guarded_between(self) -> float:
        """``between()``, which must not end the thread either."""
        try:
            return self._between()
        except BaseException:
            logger.exception("prime-runs-otel: the producer thread's work between episodes failed")
            return POLL

    def _report(self, item: T, exc: BaseException) -> None:
        try:
            self._on_error(item, exc)
        except Exception:  # a failing report must not stop the queue
            logger.exception("prime-runs-otel: reporting a failed hand-off item failed")


def _no_work_between() -> float:
    return POLL


def _after_fork_in_child() -> None:
    for handoff in list(_live):
        handoff._fresh()


os.register_at_fork(after_in_child=_after_fork_in_child)
