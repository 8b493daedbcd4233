"""The prime_rl instrumentation's batches of rollouts (``Rollouts``): what the
event loop gathers reaches the recorder thread whole and in order, at a full
batch, at the next other call, or on its own within a bounded time."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from prime_runs_otel.instrumentation.prime_rl.workers import Recorder, Rollouts


class _Recorded:
    """What the recorder thread recorded, and on which thread."""

    def __init__(self, fail_on: Any = None) -> None:
        self.items: list[tuple[Any, int, str]] = []
        self.threads: set[int] = set()
        self.fail_on = fail_on

    def __call__(self, episode: Any, step: int, kind: str) -> None:
        self.threads.add(threading.get_ident())
        if episode == self.fail_on:
            raise ValueError(f"cannot record {episode}")
        self.items.append((episode, step, kind))


def test_rollouts_reach_the_recorder_in_order_off_the_loop() -> None:
    recorded = _Recorded()
    recorder = Recorder()
    rollouts = Rollouts(recorder, recorded)
    count = Rollouts.BATCH * 2 + 5

    async def dispatch() -> None:
        for index in range(count):
            rollouts.add([f"rollout-{index}"], index // 50, "train" if index % 3 else "eval")
        # Two full batches went on their own; the rest waits for the next call.
        rollouts.hand_over()

    asyncio.run(dispatch())
    recorder.drain()
    assert recorded.items == [
        (f"rollout-{index}", index // 50, "train" if index % 3 else "eval")
        for index in range(count)
    ]
    assert threading.get_ident() not in recorded.threads


def test_a_partial_batch_goes_on_its_own() -> None:
    recorded = _Recorded()
    recorder = Recorder()
    rollouts = Rollouts(recorder, recorded)

    async def dispatch() -> None:
        rollouts.add(["first", "second"], 3, "train")
        rollouts.add(["third"], 3, "train")
        # Nothing else is logged: the loop's timer hands them over.
        for _ in range(600):
            if len(recorded.items) == 3:
                return
            await asyncio.sleep(0.05)

    asyncio.run(dispatch())
    assert recorded.items == [("first", 3, "train"), ("second", 3, "train"), ("third", 3, "train")]


def test_a_rollout_that_fails_leaves_the_rest_of_its_batch() -> None:
    recorded = _Recorded(fail_on="bad")
    recorder = Recorder()
    rollouts = Rollouts(recorder, recorded)

    async def dispatch() -> None:
        rollouts.add(["before", "bad", "after"], 0, "eval")
        rollouts.hand_over()

    asyncio.run(dispatch())
    recorder.drain()
    assert recorded.items == [("before", 0, "eval"), ("after", 0, "eval")]
