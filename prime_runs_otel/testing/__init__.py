"""A fake Prime platform for tests and for trying the exporter without an account.

:class:`FakePlatform` is a real HTTP server on loopback that speaks the platform's
wire contract (evaluations, environment hub, Prime Traces uploads, external
training runs) and records what it stored, with faults on demand. Run it from a
shell with ``python -m prime_runs_otel.testing``.
"""

from ._command import main
from ._store import FakeRun, FakeStepSamples, FakeUpload, RecordedRequest
from .fake_platform import FakePlatform

__all__ = [
    "FakePlatform",
    "FakeRun",
    "FakeStepSamples",
    "FakeUpload",
    "RecordedRequest",
    "main",
]
