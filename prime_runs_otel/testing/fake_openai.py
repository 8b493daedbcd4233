"""A fake OpenAI-compatible chat server on loopback: a real HTTP server that
answers ``POST /v1/chat/completions`` the way an inference server would.

It lets tests (and the examples) drive the real ``openai`` client, and with it
the real instrumentations of it (OpenTelemetry's ``openai-v2``, OpenInference),
without a model. Its "policy" is arithmetic: asked ``What is 17 + 25?`` it
answers with the sum, or (deterministically, for a share of the requests set
by ``accuracy``) with a near miss, so rewards vary the way a policy's do. Given
tools and a fresh question, it first calls the first tool with the
expression, then answers once the tool's result is in the conversation.
``response_model`` makes it answer as a different model than the one asked
for, the way a provider resolves an alias to a dated snapshot.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI"]

_QUESTION = re.compile(r"(-?\d+)\s*([+*-])\s*(-?\d+)")


class FakeOpenAI:
    """Use as a context manager; point an ``openai.OpenAI`` at :attr:`base_url`."""

    def __init__(
        self,
        *,
        accuracy: float = 0.7,
        host: str = "127.0.0.1",
        response_model: str | None = None,
    ) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy must be between 0 and 1, got {accuracy}")
        self.accuracy = accuracy
        self.response_model = response_model
        self.requests: list[dict[str, Any]] = []
        self._failures: list[int] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def fail_next(self, count: int = 1, *, status: int = 500) -> None:
        """Answer the next ``count`` requests with ``status`` (an inference outage)."""
        with self._lock:
            self._failures.extend([status] * count)

    def start(self) -> FakeOpenAI:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="fake-openai",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5.0)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- answering ----------------------------------------------------------------

    def _next_failure(self) -> int | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat completion for one request body."""
        with self._lock:
            self.requests.append(body)
            number = len(self.requests)
        messages = body.get("messages") or []
        tools = body.get("tools") or []
        question = _last_text(messages, "user")
        match = _QUESTION.search(question)
        # Completions are named after the conversation, not the arrival order,
        # so concurrent requests get the same answers and ids run after run.
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        if tools and match and messages and messages[-1].get("role") == "user":
            message = _tool_call_message(tools[0], match.group(0), str(number))
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": self._answer(messages, match)}
            finish = "stop"
        prompt_tokens = sum(len(json.dumps(item)) for item in messages) // 4 + 5
        completion_tokens = len(json.dumps(message)) // 4 + 1
        return {
            "id": f"chatcmpl-{digest[:24]}",
            "object": "chat.completion",
            "created": 1_767_225_600 + int(digest[:4], 16),
            "model": self.response_model or str(body.get("model", "fake-model")),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _answer(self, messages: list[dict[str, Any]], match: re.Match[str] | None) -> str:
        if match is None:
            return "I can only do arithmetic."
        left, operator, right = int(match.group(1)), match.group(2), int(match.group(3))
        result = {"+": left + right, "-": left - right, "*": left * right}[operator]
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()
        if digest[0] / 256.0 >= self.accuracy:
            result += 1 + digest[1] % 3
        return f"The answer is {result}."

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                failure = fake._next_failure()
                if failure is not None:
                    self._send(failure, {"error": {"message": "injected failure"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, {"error": {"message": "the body is not JSON"}})
                    return
                completion = fake.complete(body)
                if body.get("stream"):
                    self._stream(completion, body)
                else:
                    self._send(200, completion)

            def _stream(self, completion: dict[str, Any], body: dict[str, Any]) -> None:
                """Server-sent events, as an inference server streams: the
                message in one delta, then the finish reason, then usage if
                asked for, then ``[DONE]``."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in _stream_chunks(completion, body):
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: tests read :attr:`FakeOpenAI.requests` instead."""

        return Handler


def _stream_chunks(completion: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [
            {"index": index, **call} for index, call in enumerate(message["tool_calls"])
        ]
    head = {key: completion[key] for key in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    chunks = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks


def _last_text(messages: list[dict[str, Any]], role: str) -> str:
    for message in reversed(messages):
        if message.get("role") == role:
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(part.get("text", "")) for part in content)
    return ""


def _tool_call_message(tool: dict[str, Any], expression: str, tag: str) -> dict[str, Any]:
    name = (tool.get("function") or {}).get("name") or tool.get("name") or "tool"
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{tag}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps({"expression": expression})},
            }
        ],
    }
