"""A minimal RL loop reporting its training run through OpenTelemetry.

Install and run, from a clone of this repository (the package is not on PyPI;
the extra brings the ``openai`` client and its instrumentation, pinned to
versions that work together):

    pip install -e '.[examples]'
    python examples/rl_loop.py

The policy is served behind an OpenAI-compatible endpoint (vLLM, SGLang, ...)
and the loop's model calls are traced by OpenTelemetry's own instrumentation of
the ``openai`` client (``opentelemetry-instrumentation-openai-v2``). The loop
only wraps each rollout in an episode span with its example, step and reward:
prime-runs-otel builds each episode's record from the spans under it, and
delivers the episodes, the per-step metrics and the run's end.

Without ``OPENAI_BASE_URL`` a fake arithmetic "policy" answers on loopback, so
the example runs anywhere. Without ``PRIME_API_KEY`` the run goes to the local
store (``prime-runs-otel runs`` lists it); with it, a training run needs a team
(``PRIME_TEAM_ID``).
"""

from __future__ import annotations

import os

# Messages go on the model-call spans only with the latest GenAI conventions
# and content capture on; both are read when the instrumentation starts.
os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")

import contextlib
import random
import re
import statistics

import openai
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

import prime_runs_otel
from prime_runs_otel import episode_span, score_episode
from prime_runs_otel.testing.fake_openai import FakeOpenAI

STEPS = 3
EXAMPLES_PER_STEP = 4
ROLLOUTS_PER_EXAMPLE = 2
MODEL = "demo/policy-1b"


def reward_of(reply: str | None, answer: int) -> float:
    """1 for the right number in the reply, else 0."""
    numbers = re.findall(r"-?\d+", reply or "")
    return float(bool(numbers) and int(numbers[-1]) == answer)


def main() -> None:
    with contextlib.ExitStack() as stack:
        base_url = os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            base_url = stack.enter_context(FakeOpenAI(accuracy=0.6)).base_url
        run = stack.enter_context(
            prime_runs_otel.start_run(
                kind="train",
                name="arith-rl",
                model=MODEL,
                environments=["arith"],
                max_steps=STEPS,
                batch_size=EXAMPLES_PER_STEP * ROLLOUTS_PER_EXAMPLE,
                rollouts_per_example=ROLLOUTS_PER_EXAMPLE,
                config={"lr": 1e-6, "algorithm": "grpo"},
            )
        )
        OpenAIInstrumentor().instrument(tracer_provider=run.tracer_provider)
        client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "-"))
        examples = random.Random(0)
        for step in range(STEPS):
            rewards = []
            for index in range(EXAMPLES_PER_STEP):
                a, b = examples.randint(1, 99), examples.randint(1, 99)
                for rollout in range(ROLLOUTS_PER_EXAMPLE):
                    with episode_span(
                        run.tracer,
                        example_id=step * EXAMPLES_PER_STEP + index,
                        step=step,
                        env="arith",
                        answer=str(a + b),
                    ) as span:
                        reply = client.chat.completions.create(
                            model=MODEL,
                            messages=[
                                {"role": "system", "content": f"Rollout {rollout}: be brief."},
                                {"role": "user", "content": f"What is {a} + {b}?"},
                            ],
                        )
                        reward = reward_of(reply.choices[0].message.content, a + b)
                        score_episode(span, reward)
                    rewards.append(reward)
            # A trainer would update the policy from this step's rollouts here.
            run.log_metrics(
                {"reward/mean": statistics.fmean(rewards), "loss": 1.0 / (step + 1)}, step=step
            )
    assert run.result is not None
    print(run.result.describe())


if __name__ == "__main__":
    main()
