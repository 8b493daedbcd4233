"""An eval process reporting its run through OpenTelemetry, the short way.

Install and run, from a clone of this repository (the package is not on PyPI):

    pip install -e '.[examples]'
    python examples/eval_in_process.py

Run it as is and the run goes to the local store (no API key needed); with
PRIME_API_KEY set it goes to the platform. `prime-runs-otel runs` lists it.
"""

from __future__ import annotations

import prime_runs_otel
from prime_runs_otel.produce.synthetic import synthetic_episodes


def main() -> None:
    with prime_runs_otel.start_run(
        name="gsm8k-example",
        model="demo/solver-8b",
        environments=["gsm8k-demo"],
        framework="verifiers",
        config={"temperature": 0.7, "rollouts_per_example": 4},
    ) as run:
        # In a real eval these are verifiers Episodes (or their records) as
        # each rollout finishes.
        for episode in synthetic_episodes(40, ending_at="now"):
            run.record_episode(episode)
    assert run.result is not None
    print(run.result.describe())


if __name__ == "__main__":
    main()
