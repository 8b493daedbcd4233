"""Zero-code set-up: this script only creates spans; the exporter, the
TracerProvider and the run's identity come from the environment.

Install and run, from a clone of this repository (the package is not on PyPI;
the extra brings ``opentelemetry-instrument``):

    pip install -e '.[examples]'
    RUN=prime.run.id=my-eval-001,prime.run.name=my-eval
    OTEL_RESOURCE_ATTRIBUTES="$RUN,prime.run.environments=gsm8k-demo" \\
    OTEL_TRACES_EXPORTER=prime_runs \\
    OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
    OTEL_SERVICE_NAME=my-eval \\
    opentelemetry-instrument python examples/zero_code.py

The run completes when the process exits cleanly, fails on an unhandled
exception, and is reported crashed if the process is killed.
"""

from __future__ import annotations

from opentelemetry import trace

import prime_runs_otel
from prime_runs_otel.produce.synthetic import synthetic_episodes


def main() -> None:
    tracer = trace.get_tracer("zero-code-eval")
    for episode in synthetic_episodes(15, seed=4, ending_at="now"):
        prime_runs_otel.record_episode(tracer, episode)
    print("recorded 15 episodes")


if __name__ == "__main__":
    main()
