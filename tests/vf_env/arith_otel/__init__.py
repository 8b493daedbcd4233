"""``arith-otel``: arithmetic questions, the answer scored exactly; a
``judge`` taskset option adds a second agent that grades the first (a
multi-agent episode), and ``turns`` asks follow-up questions (multi-turn).

Answered by ``prime_runs_otel.testing.fake_openai``, deterministically.
"""

from arith_otel.harness import InProcessChatHarness
from arith_otel.taskset import ArithOtelTaskset

__all__ = ["ArithOtelTaskset", "InProcessChatHarness"]
