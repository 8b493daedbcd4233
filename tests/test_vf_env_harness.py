"""The harness of `tests/vf_env` runs verifiers' chat program inside the
eval's process (see its module): that program must ask the model exactly what
it asks from a process of its own, and end the same way when the model cannot
be reached, or the tests that compare prime-runs' uploads with this package's
would compare something verifiers never records."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prime_runs_otel.testing.fake_openai import FakeOpenAI

TASKSET = str(Path(__file__).resolve().parent / "vf_env")


@pytest.fixture(scope="module")
def chat() -> Any:
    """verifiers' chat program and the harness module (imported once: seconds)."""
    if TASKSET not in sys.path:
        sys.path.insert(0, TASKSET)
    from arith_otel import harness
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    return harness, CHAT_PROGRAM_SOURCE


@pytest.fixture
def model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(accuracy=1.0) as fake:
        yield fake


def _in_process(chat: Any, argv: list[str]) -> Any:
    harness, source = chat
    code = compile(source, "<chat program>", "exec")
    return asyncio.run(harness._run_chat_program(code, ["chat.py", *argv]))


def test_the_program_in_process_asks_what_it_asks_in_a_process_of_its_own(
    chat: Any, model: FakeOpenAI, tmp_path: Path
) -> None:
    argv = [
        f"--base-url={model.base_url}",
        "--api-key=secret",
        "--model=demo/model",
        "--system-prompt=Answer with a number.",
        "--prompt=What is 18 + 8?",
    ]
    program = tmp_path / "chat.py"
    program.write_text(chat[1])
    alone = subprocess.run(
        [sys.executable, str(program), *argv], capture_output=True, text=True, timeout=120
    )
    assert alone.returncode == 0, alone.stderr
    from_process = list(model.requests)
    model.requests.clear()
    result = _in_process(chat, argv)
    assert (result.exit_code, result.stderr) == (0, "")
    assert model.requests == from_process
    [request] = from_process
    assert request["messages"][-1] == {"role": "user", "content": "What is 18 + 8?"}
    assert request["stream"] is True


def test_the_program_in_process_exits_97_when_the_model_is_unreachable(chat: Any) -> None:
    """verifiers tells a transport failure (exit 97, an InterceptionError)
    from a harness failure by the program's exit code."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    argv = [f"--base-url=http://127.0.0.1:{port}/v1", "--api-key=x", "--model=m", "--prompt=hi"]
    result = _in_process(chat, argv)
    assert result.exit_code == 97
    assert "ConnectError" in result.stderr or "APIConnectionError" in result.stderr, result.stderr
