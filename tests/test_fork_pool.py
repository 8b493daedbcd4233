"""Episodes recorded in forked workers that never call ``finish()`` (a
``multiprocessing`` fork pool, whose workers leave through ``os._exit`` or a
SIGTERM, so no exit handler of theirs runs) are delivered with the parent's
run, and the parent's result counts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

POOL_PRODUCER = textwrap.dedent(
    """
    import json, multiprocessing, sys
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    run = pro.start_run(name="pool", environments=["gsm8k"], finish_timeout=60)
    records = list(synthetic_episodes(50, seed=7))

    def work(record):
        run.record_episode(record)
        return record["id"]

    for record in records[:10]:
        run.record_episode(record)
    context = multiprocessing.get_context("fork")
    if sys.argv[1] == "terminate":  # the pool's own exit: SIGTERM to every worker
        with context.Pool(4) as pool:
            done = pool.map(work, records[10:], chunksize=5)
    else:  # workers replaced after each task, leaving through os._exit
        pool = context.Pool(4, maxtasksperchild=1)
        done = pool.map(work, records[10:], chunksize=5)
        pool.close()
        pool.join()
    assert len(done) == 40
    result = run.finish()
    print(json.dumps(result.__dict__), flush=True)
    """
)


def _produce(how: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", POOL_PRODUCER, how],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_fork_pool_workers_deliver_what_they_recorded(online: FakePlatform) -> None:
    expected = {record["id"] for record in synthetic_episodes(50, seed=7)}
    for how in ("terminate", "exit"):
        result = _produce(how)

        assert (result["episodes"], result["pending"], result["failed"]) == (50, 0, 0), how
        assert result["closed"] is True
        platform_run = next(run for run in online.runs() if run.id == result["platform_id"])
        assert platform_run.status == "COMPLETED"
        deliveries = online.episode_deliveries(platform_run.id)
        assert set(deliveries) == expected and set(deliveries.values()) == {1}
