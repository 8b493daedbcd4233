"""verifiers' null harness (its chat program), run by this interpreter.

The built-in harness prepares its program with ``uv sync`` at run time,
which needs the network; this one runs the same program with the Python that
runs the eval, whose environment already has the program's dependencies.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarness


class _ThisPython:
    """The runtime, except that a PEP 723 script runs with ``sys.executable``."""

    def __init__(self, runtime: vf.Runtime) -> None:
        self._runtime = runtime

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f".chat-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


class VenvChatHarness(NullHarness):
    async def setup(self, runtime: vf.Runtime) -> None:
        return None

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> Any:
        return await super().launch(ctx, trace, _ThisPython(runtime), *args, **kwargs)
