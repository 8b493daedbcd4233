"""`make check-backends`: a run as a real tracing backend shows it.

Not a benchmark and not part of `make test`: it needs Arize Phoenix
(`arize-phoenix`, about 850 MB installed), which `make check-backends` puts
in a virtualenv of its own (`.venv-phoenix`) so the test environment stays
small. It starts Phoenix on loopback with a throw-away working folder, sends
a demo run to the fake platform (the platform exporter) and, beside it,
through `Run.add_exporter` to Phoenix's OTLP endpoint, then reads the spans
back through Phoenix's REST API and checks that episodes, agents and model
calls show with their kinds, inputs, outputs and token counts, and that no
record or config blob reached the backend. Exit code 0 when all of that
holds, 1 with what is missing.

    python bench/check_backends.py --phoenix .venv-phoenix/bin/phoenix
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHECKS: list[tuple[str, bool, str]] = []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _start_phoenix(binary: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port, grpc_port = _free_port(), _free_port()
    env = dict(os.environ)
    env.update(
        PHOENIX_WORKING_DIR=str(folder),
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
        PHOENIX_TELEMETRY_ENABLED="false",
    )
    log = (folder / "phoenix.log").open("wb")
    process = subprocess.Popen(
        [binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"Phoenix exited with {process.returncode}; see {folder}/phoenix.log")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return process, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    process.kill()
    raise SystemExit(f"Phoenix did not answer on {url} within 300 s; see {folder}/phoenix.log")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def _send_run(phoenix: str, episodes: int) -> tuple[str, int]:
    """A demo run to the fake platform, and beside it to Phoenix."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes
    from prime_runs_otel.testing import FakePlatform

    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "span_only"
    with FakePlatform() as platform, tempfile.TemporaryDirectory() as spool:
        os.environ.update(platform.client_env())
        run = pro.start_run(
            name="phoenix-check",
            model="demo/solver-8b",
            environments=["gsm8k-demo"],
            mode="online",
            spool_dir=spool,
            config={"note": "kept off the tracing backend"},
        )
        run.add_exporter(OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces"))
        for record in synthetic_episodes(episodes, seed=11, ending_at="now"):
            run.record_episode(record)
        result = run.finish()
        delivered = len(platform.episodes(result.platform_id or ""))
    return result.local_id, delivered


def _spans(phoenix: str) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page = _get(f"{phoenix}/v1/projects/default/spans?limit=1000{cursor}")
        spans.extend(page.get("data", []))
        if not page.get("next_cursor"):
            return spans
        cursor = f"&cursor={page['next_cursor']}"


def _check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def _read_back(phoenix: str, episodes: int) -> None:
    deadline = time.monotonic() + 60
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        spans = _spans(phoenix)
        if sum("prime.episode.id" in (span.get("attributes") or {}) for span in spans) >= episodes:
            break
        time.sleep(1)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_kind.setdefault(str(span.get("span_kind")), []).append(span)
    agents, calls = by_kind.get("AGENT", []), by_kind.get("LLM", [])
    chains = [
        s for s in by_kind.get("CHAIN", []) if "prime.episode.id" in (s.get("attributes") or {})
    ]
    episode_spans = [s for s in spans if "prime.episode.id" in (s.get("attributes") or {})]
    print(
        f"phoenix_spans {len(spans)} spans\nphoenix_episodes {len(chains)} spans\n"
        f"phoenix_agents {len(agents)} spans\nphoenix_model_calls {len(calls)} spans"
    )

    def attributes(span: dict[str, Any]) -> dict[str, Any]:
        return dict(span.get("attributes") or {})

    _check(
        "every episode shows as a CHAIN span",
        len(chains) == len(episode_spans) == episodes,
        f"{len(chains)} of {len(episode_spans)}",
    )
    _check(
        "episodes show their first prompt",
        all(attributes(span).get("input.value") for span in chains),
    )
    _check(
        "most episodes show their final completion (failed ones may end in no answer)",
        sum(bool(attributes(span).get("output.value")) for span in chains) >= episodes * 0.75,
    )
    _check(
        "episodes show token counts",
        all(attributes(span).get("gen_ai.usage.input_tokens") for span in chains),
    )
    _check("agents show as AGENT spans", len(agents) >= episodes, f"{len(agents)}")
    _check("agents show their name", all(attributes(span).get("agent.name") for span in agents))
    _check("model calls show as LLM spans", len(calls) >= episodes, f"{len(calls)}")
    answered = [span for span in calls if span.get("status_code") != "ERROR"]
    _check(
        "model calls show inputs and outputs",
        bool(answered)
        and all(
            attributes(span).get("input.value") and attributes(span).get("output.value")
            for span in answered
        ),
    )
    _check(
        "model calls show token counts",
        bool(answered)
        and all(
            isinstance(attributes(span).get("llm.token_count.prompt"), int)
            and isinstance(attributes(span).get("llm.token_count.completion"), int)
            for span in answered
        ),
    )
    _check(
        "model calls name their provider and model",
        all(
            attributes(span).get("gen_ai.provider.name") and attributes(span).get("llm.model_name")
            for span in calls
        ),
    )
    ends = [span for span in spans if span.get("name") == "prime.run.end"]
    _check(
        "the run's end shows with a kind and its outcome",
        len(ends) == 1
        and ends[0].get("span_kind") == "CHAIN"
        and str(attributes(ends[0]).get("output.value", "")).startswith("completed"),
    )
    leaked = [
        key
        for span in spans
        for key in attributes(span)
        if key.startswith(("prime.episode.record", "prime.run.config"))
    ]
    _check("no record or config blob reached the backend", not leaked, ", ".join(leaked[:3]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phoenix", required=True, help="the `phoenix` command to start")
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phoenix-") as folder:
        started = time.monotonic()
        process, url = _start_phoenix(args.phoenix, Path(folder))
        print(f"phoenix_start {time.monotonic() - started:.1f} s  ({url})", flush=True)
        try:
            run_id, delivered = _send_run(url, args.episodes)
            _check(
                "the platform got every episode",
                delivered == args.episodes,
                f"{delivered} of {args.episodes}",
            )
            _read_back(url, args.episodes)
        finally:
            _stop(process)
    failed = [name for name, ok, _ in CHECKS if not ok]
    print(f"\n{len(CHECKS) - len(failed)} of {len(CHECKS)} checks hold (run {run_id})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
