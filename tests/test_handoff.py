"""``Run.record_episode`` hands the episode to the run's producer thread and
returns: order, the run's end after its episodes, backpressure, forks,
unencodable records and interrupted ``with`` blocks, through real
``start_run`` pipelines into a real spool (local mode, no key)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.errors import RecordError
from prime_runs_otel.produce.handoff import DEFAULT_CAPACITY, Handoff
from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes
from prime_runs_otel.run import RunFinishedError

SUBPROCESS_TIMEOUT = 120


def _stored(run_id: str) -> tuple[list[str], tuple[Any, ...]]:
    """The run's episode ids in the order the spool took them, and its end."""
    db = sqlite3.connect(resolve_settings().spool_path)
    try:
        ids = [
            row[0]
            for row in db.execute(
                "SELECT episode_id FROM episodes WHERE run_id = ? ORDER BY seq", (run_id,)
            )
        ]
        end = db.execute(
            "SELECT end_status, end_expected, close_state FROM runs WHERE local_id = ?", (run_id,)
        ).fetchone()
    finally:
        db.close()
    return ids, tuple(end)


def _wait_for(condition: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


class GatedExporter(SpanExporter):
    """A listener that holds the producer thread on its first episode span
    until the gate opens: a slow exporter, as slow as the test wants."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.held = threading.Event()
        self.owner = os.getpid()
        self.episodes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            if span.name.startswith("episode "):
                self.episodes += 1
                if os.getpid() == self.owner and not self.gate.is_set():
                    self.held.set()
                    self.gate.wait()
        return SpanExportResult.SUCCESS


def test_order_is_kept_across_thousands_and_the_run_ends_after_them() -> None:
    listener = InMemorySpanExporter()
    run = pro.start_run(environments=["env-a"], child_spans=False)
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(listener))
    episodes = list(synthetic_episodes(3000, seed=7, target_bytes=600))
    returned = [run.record_episode(episode) for episode in episodes]
    result = run.finish(timeout=120)

    expected = [episode["id"] for episode in episodes]
    assert returned == expected
    stored, end = _stored(run.id)
    assert stored == expected
    assert end == ("completed", 3000, "closed")
    assert (result.episodes, result.unencodable, result.closed) == (3000, 0, True)
    names = [span.name for span in listener.get_finished_spans()]
    assert names[-1] == "prime.run.end"
    assert sum(name.startswith("episode ") for name in names) == 3000


def test_an_episode_is_a_child_of_the_span_current_where_it_was_recorded() -> None:
    listener = InMemorySpanExporter()
    run = pro.start_run(environments=["env-a"], child_spans=False)
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(listener))
    with run.tracer.start_as_current_span("outer") as outer:
        run.record_episode(synthetic_episode(0))
    run.record_episode(synthetic_episode(1))
    run.finish(timeout=60)

    episodes = {
        span.attributes["prime.episode.id"]: span
        for span in listener.get_finished_spans()
        if span.name.startswith("episode ")
    }
    inside, outside = episodes[synthetic_episode(0)["id"]], episodes[synthetic_episode(1)["id"]]
    assert inside.parent is not None
    assert inside.parent.span_id == outer.get_span_context().span_id
    assert outside.parent is None


def test_a_slow_exporter_makes_the_caller_wait_and_nothing_is_dropped() -> None:
    slow = GatedExporter()
    run = pro.start_run(environments=["env-a"], child_spans=False)
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(slow))
    returned: list[str] = []

    def record() -> None:
        for episode in synthetic_episodes(DEFAULT_CAPACITY * 3, seed=3, target_bytes=600):
            returned.append(run.record_episode(episode))

    caller = threading.Thread(target=record)
    caller.start()
    try:
        slow.held.wait(60)
        # One episode on the producer thread, a full queue behind it, and the
        # caller held in record_episode with the next one.
        _wait_for(lambda: len(returned) == DEFAULT_CAPACITY + 1, "the hand-off to fill")
        time.sleep(0.3)
        assert caller.is_alive()
        assert len(returned) == DEFAULT_CAPACITY + 1, "the caller went on past a full hand-off"
    finally:
        slow.gate.set()
        caller.join(60)
    result = run.finish(timeout=120)

    assert len(returned) == DEFAULT_CAPACITY * 3
    stored, end = _stored(run.id)
    assert stored == returned
    assert end == ("completed", DEFAULT_CAPACITY * 3, "closed")
    assert result.episodes == DEFAULT_CAPACITY * 3
    assert slow.episodes == DEFAULT_CAPACITY * 3


def test_an_unencodable_episode_is_counted_and_named_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = pro.start_run(environments=["env-a"], child_spans=False)
    good = [synthetic_episode(index) for index in range(3)]
    bad = {"id": "cannot-encode", "traces": [], "info": {"tags": {"a", "b"}}}
    with caplog.at_level(logging.WARNING, logger="prime_runs_otel"):
        run.record_episode(good[0])
        assert run.record_episode(bad) == "cannot-encode"
        run.record_episode(good[1])
        run.record_episode(good[2])
        result = run.finish(timeout=60)

    assert (result.episodes, result.unencodable, result.closed) == (3, 1, True)
    assert "1 episode(s) could not be encoded" in result.describe()
    assert any(
        "cannot-encode" in message and "could not be encoded" in message
        for message in caplog.messages
    )
    stored, end = _stored(run.id)
    assert stored == [episode["id"] for episode in good]
    assert end == ("completed", 3, "closed")
    shown = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "show", run.id, "--json"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=dict(os.environ),
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["unencodable"] == 1


def test_what_is_cheap_to_check_still_raises_on_the_callers_thread() -> None:
    run = pro.start_run(environments=["env-a"], child_spans=False)
    with pytest.raises(RecordError, match="expected a verifiers Episode or its record"):
        run.record_episode(42)
    with pytest.raises(RecordError, match="non-empty string 'id'"):
        run.record_episode({"traces": []})
    with pytest.raises(RecordError, match="has no 'traces' list"):
        run.record_episode({"id": "no-traces"})
    run.record_episode(synthetic_episode(0))
    result = run.finish(timeout=60)
    with pytest.raises(RunFinishedError, match="is finished"):
        run.record_episode(synthetic_episode(1))
    assert (result.episodes, result.unencodable) == (1, 0)


class _Unreadable:
    """Has ``to_record()`` and an id, and fails when it is finally read."""

    id = "unreadable"

    def to_record(self) -> dict[str, Any]:
        raise ValueError("the rollout's state was released")


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
_foreign = st.one_of(
    st.builds(set, st.lists(st.integers(), max_size=3)),
    st.binary(max_size=8),
    st.just(object()),
    st.just(_Unreadable()),
    st.integers(min_value=2**64, max_value=2**70),
)
_values = st.recursive(
    st.one_of(_json_leaf, _foreign),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_episodes = st.one_of(
    _values,
    st.fixed_dictionaries(
        {"id": st.one_of(st.text(max_size=8), st.integers()), "traces": _values},
        optional={"info": _values},
    ),
    st.fixed_dictionaries(
        {"id": st.text(min_size=1, max_size=8), "traces": st.lists(_values, max_size=2)},
        optional={"info": _values, "env": _values},
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_episodes, max_size=4))
def test_any_input_is_refused_counted_or_recorded_and_loses_nothing_else(
    inputs: list[Any],
) -> None:
    run = pro.start_run(environments=["env-a"], child_spans=False)
    first, last = synthetic_episode(0, seed=11), synthetic_episode(1, seed=11)
    run.record_episode(first)
    handed = 0
    for index, value in enumerate(inputs):
        if isinstance(value, dict) and isinstance(value.get("id"), str) and value["id"]:
            value = {**value, "id": f"fuzz-{index}-{value['id']}"}
        try:
            run.record_episode(value)
        except RecordError:
            continue
        handed += 1
    run.record_episode(last)
    result = run.finish(timeout=60)

    stored, end = _stored(run.id)
    assert stored[0] == first["id"] and stored[-1] == last["id"]
    # Refused at the call, counted as unencodable on the producer thread,
    # counted as damaged when the exporter reads it, or stored: nothing else.
    assert result.episodes + result.unencodable + result.corrupt == handed + 2
    assert len(stored) == result.episodes
    assert end == ("completed", handed + 2 - result.unencodable, "closed")


@pytest.mark.parametrize(
    ("raised", "status"), [(KeyboardInterrupt, "cancelled"), (RuntimeError, "failed")]
)
def test_a_with_block_that_raises_still_ends_after_every_episode(
    raised: type[BaseException], status: str
) -> None:
    episodes = list(synthetic_episodes(400, seed=5, target_bytes=600))
    with pytest.raises(raised), pro.start_run(environments=["env-a"], child_spans=False) as run:
        for episode in episodes:
            run.record_episode(episode)
        raise raised("stop")
    assert run.result is not None
    assert (run.result.status, run.result.episodes) == (status, 400)
    stored, end = _stored(run.id)
    assert stored == [episode["id"] for episode in episodes]
    assert end == (status, 400, "closed")


def test_ctrl_c_while_waiting_for_room_ends_the_run_with_what_was_handed_over() -> None:
    slow = GatedExporter()
    returned: list[str] = []

    def interrupt_when_held() -> None:
        slow.held.wait(60)
        _wait_for(lambda: len(returned) == DEFAULT_CAPACITY + 1, "the hand-off to fill")
        time.sleep(0.3)  # the caller is inside record_episode, waiting for room
        os.kill(os.getpid(), signal.SIGINT)
        slow.gate.set()

    interrupter = threading.Thread(target=interrupt_when_held)
    with (
        pytest.raises(KeyboardInterrupt),
        pro.start_run(environments=["env-a"], child_spans=False) as run,
    ):
        run.tracer_provider.add_span_processor(SimpleSpanProcessor(slow))
        interrupter.start()
        for episode in synthetic_episodes(DEFAULT_CAPACITY * 4, seed=9, target_bytes=600):
            returned.append(run.record_episode(episode))
    interrupter.join(60)

    assert run.result is not None
    assert (run.result.status, run.result.episodes) == ("cancelled", DEFAULT_CAPACITY + 1)
    stored, end = _stored(run.id)
    assert stored == returned
    assert end == ("cancelled", DEFAULT_CAPACITY + 1, "closed")


#: The parent's producer thread is held by a slow listener with its hand-off
#: full when the process forks; the child records, flushes and exits on its
#: own fresh hand-off, then the parent goes on.
FORK_WHILE_HELD = textwrap.dedent(
    """
    import json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    import prime_runs_otel as pro
    from prime_runs_otel.produce.handoff import DEFAULT_CAPACITY
    from prime_runs_otel.produce.synthetic import synthetic_episodes
    from test_handoff import GatedExporter, _wait_for

    slow = GatedExporter()
    run = pro.start_run(environments=["env-a"], child_spans=False)
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(slow))
    returned = []

    def record():
        for episode in synthetic_episodes(DEFAULT_CAPACITY * 2, seed=1, target_bytes=600):
            returned.append(run.record_episode(episode))

    caller = threading.Thread(target=record)
    caller.start()
    slow.held.wait(60)
    _wait_for(lambda: len(returned) == DEFAULT_CAPACITY + 1, "the hand-off to fill")
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for episode in synthetic_episodes(20, seed=2, target_bytes=600):
                run.record_episode(episode)
            result = run.finish(timeout=60)
            code = 0 if result.status == "running" else 3
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    slow.gate.set()
    caller.join(60)
    result = run.finish(timeout=60)
    print(json.dumps({"child": code, "run": run.id, "result": result.__dict__}), flush=True)
    """
)


def test_a_forked_child_records_and_flushes_on_a_hand_off_of_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_HELD, os.path.dirname(__file__)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=dict(os.environ),
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["child"] == 0, done.stderr
    parent = [
        episode["id"]
        for episode in synthetic_episodes(DEFAULT_CAPACITY * 2, seed=1, target_bytes=600)
    ]
    child = [episode["id"] for episode in synthetic_episodes(20, seed=2, target_bytes=600)]
    stored, end = _stored(report["run"])
    assert sorted(stored) == sorted(parent + child)
    assert [episode for episode in stored if episode in set(parent)] == parent
    assert end == ("completed", DEFAULT_CAPACITY * 2, "closed")
    # The child's own 20 are in the spool, and the run's count is the parent's:
    # the run closed once the parent's episodes were all in.
    assert report["result"]["episodes"] == DEFAULT_CAPACITY * 2 + 20


def test_a_handoff_keeps_going_after_a_failing_item_and_its_failing_report() -> None:
    handled: list[int] = []
    failed: list[int] = []

    def handle(item: int) -> None:
        if item % 3 == 0:
            raise ValueError(item)
        handled.append(item)

    def on_error(item: int, exc: BaseException) -> None:
        failed.append(item)
        if item == 3:
            raise RuntimeError("the report failed too")

    handoff: Handoff[int] = Handoff(handle, on_error, capacity=2)
    for item in range(1, 11):
        handoff.put(item)
    handoff.close()
    assert handled == [1, 2, 4, 5, 7, 8, 10]
    assert failed == [3, 6, 9]
    with pytest.raises(ValueError, match="capacity must be 1 or more"):
        Handoff(handle, on_error, capacity=0)


def test_a_caller_held_at_a_full_handoff_goes_on_at_a_quarter_free_not_at_one_slot() -> None:
    """A caller that outruns the thread sleeps once per quarter of the queue,
    not once per item: each wake-up costs both threads a futex call and the GIL."""
    turns = threading.Semaphore(0)
    started = threading.Event()
    handled: list[int] = []

    def handle(item: int) -> None:
        started.set()
        turns.acquire()
        handled.append(item)

    handoff: Handoff[int] = Handoff(handle, lambda item, exc: None, capacity=8)
    handoff.put(0)
    started.wait(60)  # item 0 is in handle(), the queue empty
    returned: list[int] = []

    def record() -> None:
        for item in range(1, 20):
            handoff.put(item)
            returned.append(item)

    caller = threading.Thread(target=record)
    caller.start()
    try:
        # Eight queued, the caller waiting with the ninth.
        _wait_for(lambda: len(returned) == 8, "the hand-off to fill")
        turns.release()  # 0 handled, 1 taken: seven queued, one slot free
        _wait_for(lambda: handled == [0], "the first item")
        time.sleep(0.3)
        assert len(returned) == 8, "the caller was let in before a quarter was free"
        turns.release()  # 1 handled, 2 taken: six queued; the caller fills it up
        _wait_for(lambda: len(returned) == 10, "the caller to go on at a quarter free")
        time.sleep(0.3)
        assert len(returned) == 10
    finally:
        for _ in range(20):
            turns.release()
        caller.join(60)
    handoff.close()
    assert handled == list(range(20))


def test_several_callers_at_a_full_handoff_all_get_through_in_their_own_order() -> None:
    handled: list[tuple[int, int]] = []
    handoff: Handoff[tuple[int, int]] = Handoff(
        lambda item: handled.append(item), lambda item, exc: None, capacity=3
    )

    def record(caller: int) -> None:
        for index in range(500):
            handoff.put((caller, index))

    callers = [threading.Thread(target=record, args=(number,)) for number in range(4)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(60)
    handoff.close()
    assert len(handled) == 2000
    for number in range(4):
        assert [index for caller, index in handled if caller == number] == list(range(500))


def test_an_idle_handoff_waits_without_spinning() -> None:
    """An empty queue's consumer sleeps until an item comes (or a poll
    interval passes), not in a loop of waits of no time: such a loop kept a
    core busy for as long as a run recorded nothing, on every run. Counted
    as the consumer's wake-ups over a second, which a loaded machine does
    not change (a spinning consumer makes thousands)."""
    handled: list[int] = []
    handoff: Handoff[int] = Handoff(handled.append, lambda item, exc: None)
    try:
        handoff.put(1)
        assert handoff.drain(10)
        queue = handoff._queue
        waits = 0
        ready = queue._item_ready

        class CountingWakeup:
            def post(self) -> None:
                ready.post()

            def wait(self, timeout: float) -> bool:
                nonlocal waits
                waits += 1
                return ready.wait(timeout)

        queue._item_ready = CountingWakeup()  # type: ignore[assignment]
        time.sleep(1.0)
        assert waits < 50, f"the idle consumer woke {waits} times in a second"
        handoff.put(2)
        assert handoff.drain(10) and handled == [1, 2]
    finally:
        handoff.close(10)


def test_between_runs_on_the_thread_after_items_and_while_idle_and_survives_raising() -> None:
    """A run's producer exports its span batches in ``between``: it runs on
    the hand-off's own thread, after every item and while the queue is empty
    (for as long as it says), and what it raises stops nothing."""
    handled: list[int] = []
    calls: list[tuple[str, int]] = []
    idle_calls = threading.Event()

    def between() -> float:
        calls.append((threading.current_thread().name, len(handled)))
        # Once after the last item, then at least twice more while idle.
        if sum(1 for _, seen in calls if seen == 3) >= 3:
            idle_calls.set()
        if len(calls) % 2:
            raise RuntimeError("between failed")
        return 0.01

    handoff: Handoff[int] = Handoff(
        handled.append, lambda item, exc: None, name="with-between", between=between
    )
    try:
        for item in range(3):
            handoff.put(item)
        assert handoff.drain(10) and handled == [0, 1, 2]
        assert idle_calls.wait(10), "between was not called while the queue was empty"
        assert {name for name, _ in calls} == {"with-between"}
        # After each item: a call that saw it handled.
        assert {1, 2, 3} <= {seen for _, seen in calls}
        handoff.put(3)
        assert handoff.drain(10) and handled == [0, 1, 2, 3]
    finally:
        handoff.close(10)
