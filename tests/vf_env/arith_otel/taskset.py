"""The taskset: ``What is A + B?``, rewarded 1.0 when the reply holds A + B."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class ArithOtelData(vf.TaskData):
    answer: int


def _text(message: object) -> str:
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(getattr(part, "text", "")) for part in content)
    return ""


class ArithOtelTask(vf.Task[ArithOtelData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        replies = [m for m in trace.messages if getattr(m, "role", None) == "assistant"]
        return float(bool(replies) and str(self.data.answer) in _text(replies[-1]))

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        replies = [m for m in trace.messages if getattr(m, "role", None) == "assistant"]
        return float(sum(len(_text(m)) for m in replies))


class ArithOtelConfig(vf.TasksetConfig):
    num_tasks: int = 4


class ArithOtelTaskset(vf.Taskset[ArithOtelTask, ArithOtelConfig]):
    def load(self) -> Iterator[ArithOtelTask]:
        for index in range(self.config.num_tasks):
            left, right = 11 + 7 * index, 5 + 3 * index
            data = ArithOtelData(prompt=f"What is {left} + {right}?", answer=left + right)
            yield ArithOtelTask(data, self.config.task)
