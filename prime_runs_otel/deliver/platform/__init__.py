"""The platform's wire contract: one module per API, no delivery policy.

Callers (the uploader) decide what to persist before a call and whether a
failed call may be replayed; these modules only speak the API and classify
failures (:class:`~prime_runs_otel.platform.http.PlatformError`).
"""

from .evals import EvalsAPI
from .http import PlatformClient, PlatformError
from .traces import TracesAPI

__all__ = ["EvalsAPI", "PlatformClient", "PlatformError", "TracesAPI"]
