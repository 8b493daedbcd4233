"""Code that owns its TracerProvider: the pieces instead of start_run().

Install and run, from a clone of this repository (the package is not on PyPI):

    pip install -e '.[examples]'
    python examples/own_tracer_provider.py

The run is the Resource; the exporter is one more span processor beside any
others (an OTLP exporter to Jaeger or Tempo would sit next to it unchanged).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from prime_runs_otel import (
    PrimeRunsSpanExporter,
    emit_run_end,
    emit_run_start,
    record_episode,
    run_resource,
)
from prime_runs_otel.produce.synthetic import synthetic_episodes


def main() -> None:
    resource = run_resource(
        name="own-provider-example",
        model="demo/solver-8b",
        environments=["gsm8k-demo"],
        framework="custom-loop",
    )
    exporter = PrimeRunsSpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("my-eval")

    emit_run_start(tracer, {"temperature": 0.2})
    count = 0
    for episode in synthetic_episodes(20, seed=7, ending_at="now"):
        record_episode(tracer, episode)
        count += 1
    emit_run_end(tracer, "completed", episodes_recorded=count)

    provider.force_flush()
    run_id = str(resource.attributes["prime.run.id"])
    run = exporter.wait_closed(run_id, timeout=60)
    provider.shutdown()
    print(
        f"run {run_id}: {run.close_state if run else 'unknown'}, "
        f"{run.episodes if run else 0} episodes"
    )


if __name__ == "__main__":
    main()
