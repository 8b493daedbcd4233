"""verifiers' null harness, its chat program run inside the eval's process.

The built-in harness prepares its program with ``uv sync`` at run time
(which needs the network) and starts one Python process per rollout, which
spends seconds importing ``openai``. This one hands verifiers'
``launch_chat_program`` a runtime view whose ``run_program`` runs the very
same program (``CHAT_PROGRAM_SOURCE``, with the argv verifiers built for it)
as a coroutine on the eval's event loop: the same requests reach the
interception endpoint, so the recorded traces are those of the subprocess,
while ``openai`` is imported once for the whole eval. verifiers' ``Harness``
allows this: "the interception is the contract, not the process".

What differs from a process of its own: the program shares the eval's
environment variables (verifiers would pass it the harness's ``env`` and
drop the host's ``*API_KEY*`` names), writes its output to the eval's own
stdout and stderr, and a cancelled rollout cancels the coroutine instead of
killing a process group.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import CodeType
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarness

#: The first word of the argv ``prepare_uv_script`` hands back: ``run_program``
#: runs such an argv in this process.
IN_PROCESS = "<in-process chat program>"
_compiled: dict[str, CodeType] = {}


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    """``sys.argv`` for the program's own ``parse_args``, which reads it."""
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


async def _run_chat_program(code: CodeType, argv: list[str]) -> vf.ProgramResult:
    """Run the program's ``main()`` as ``python program.py *argv`` would,
    with its exit status (0, ``SystemExit``'s code, or 1 for an uncaught
    exception; the traceback as stderr) as a ``ProgramResult``."""
    namespace: dict[str, Any] = {"__name__": "verifiers_chat_program"}
    exec(code, namespace)  # module body only: ``main()`` runs below
    parse_args = namespace["parse_args"]

    def parse_this_argv() -> Any:
        # Called once, synchronously, before the program's first await.
        with _argv(argv):
            return parse_args()

    namespace["parse_args"] = parse_this_argv
    try:
        await namespace["main"]()
    except SystemExit as exit_:
        code_ = exit_.code
        status = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        # The traceback holds the cause (a transport error exits 97), as the
        # program's stderr would.
        return vf.ProgramResult(
            exit_code=status, stdout="", stderr=traceback.format_exc() if status else ""
        )
    except Exception:  # an uncaught error is the program's exit 1
        return vf.ProgramResult(exit_code=1, stdout="", stderr=traceback.format_exc())
    return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class _InProcess:
    """The runtime, except that the chat program runs in this process: files
    stay in the runtime's folder, relative paths in the argv are resolved
    there (the program's working directory in the subprocess runtime)."""

    def __init__(self, runtime: vf.Runtime) -> None:
        workdir = getattr(runtime, "workdir", None)
        if workdir is None:
            raise RuntimeError(
                "the arith-otel harness runs its chat program in the eval's process and "
                "needs the subprocess runtime: pass --env.agent.runtime.type subprocess"
            )
        self._runtime = runtime
        self._workdir = Path(workdir)

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        source = script.decode() if isinstance(script, bytes) else script
        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest not in _compiled:
            _compiled[digest] = compile(source, f"<verifiers chat program {digest[:16]}>", "exec")
        return [IN_PROCESS, digest]

    async def run_program(self, argv: list[str], env: dict[str, str]) -> vf.ProgramResult:
        if argv[:1] != [IN_PROCESS]:
            return await self._runtime.run_program(argv, env)
        code = _compiled[argv[1]]
        return await _run_chat_program(code, [argv[1], *map(self._in_workdir, argv[2:])])

    def _in_workdir(self, arg: str) -> str:
        name, sep, value = arg.partition("=")
        if name == "--initial-messages-file" and sep and not Path(value).is_absolute():
            return f"{name}={self._workdir / value}"
        return arg

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


class InProcessChatHarness(NullHarness):
    async def setup(self, runtime: vf.Runtime) -> None:
        return None

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> Any:
        return await super().launch(ctx, trace, _InProcess(runtime), *args, **kwargs)
