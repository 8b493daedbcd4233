"""The taskset: ``What is A + B?``, rewarded 1.0 when the reply holds A + B;
with ``--env.taskset.task.judge.*`` set, a model judge grades the reply too."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import verifiers.v1 as vf


class ArithOtelData(vf.TaskData):
    answer: int


class ArithJudge(vf.Judge[str]):
    prompt = "A student was asked: {question}\nThe student replied: {response}\nSolve it yourself."


class ArithOtelTaskConfig(vf.TaskConfig):
    judge: vf.JudgeConfig | None = None
    """A model judge (its endpoint and model); none by default."""


def _text(message: object) -> str:
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(getattr(part, "text", "")) for part in content)
    return ""


def _last_reply(trace: vf.Trace) -> str:
    replies = [m for m in trace.messages if getattr(m, "role", None) == "assistant"]
    return _text(replies[-1]) if replies else ""


class ArithOtelTask(vf.Task[ArithOtelData, vf.State, ArithOtelTaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if self.data.idx == 1 and os.environ.get("ARITH_OTEL_BREAK_TASK_1"):
            # A grader that breaks on one task: its rollouts end in error,
            # and `vf-eval --resume` runs them again.
            raise RuntimeError("the grader broke on task 1")
        if self.data.idx == 2 and os.environ.get("ARITH_OTEL_HANG_TASK_2"):
            # A grader that never returns: the eval is still running when
            # somebody presses Ctrl-C (or the process is killed).
            await asyncio.sleep(3600)
        return float(str(self.data.answer) in _last_reply(trace))

    @vf.reward(weight=0.5)
    async def judged(self, trace: vf.Trace) -> float:
        """The judge's own answer agrees with the reply (0 without a judge)."""
        if self.config.judge is None:
            return 0.0
        verdict = await ArithJudge(self.config.judge).evaluate(
            trace=trace,
            question=str(self.data.prompt),
            answer=str(self.data.answer),
            response=_last_reply(trace),
        )
        return float(str(self.data.answer) in verdict.text)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(_last_reply(trace)))


class ArithOtelConfig(vf.TasksetConfig):
    num_tasks: int = 4
    task: ArithOtelTaskConfig = ArithOtelTaskConfig()


class ArithOtelTaskset(vf.Taskset[ArithOtelTask, ArithOtelConfig]):
    def load(self) -> Iterator[ArithOtelTask]:
        for index in range(self.config.num_tasks):
            left, right = 11 + 7 * index, 5 + 3 * index
            data = ArithOtelData(prompt=f"What is {left} + {right}?", answer=left + right)
            yield ArithOtelTask(data, self.config.task)
