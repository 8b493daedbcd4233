"""One HTTP call to the platform, and an honest account of how it failed.

There is deliberately no retry loop here. Whether a failed call may be sent
again depends on what the caller persisted before sending it (the uploader
keeps that state in the spool), so this layer only classifies: *retryable*
failures may succeed later, and *ambiguous* ones may already have acted on
the server. A connect error or a 429 never acted; a 502, a read timeout or a
dropped connection may have.
"""

from __future__ import annotations

import functools
import json
import ssl
import sys
from collections.abc import Callable
from typing import Any

import httpx
from prime_traces.core.client import AMBIGUOUS_TRANSPORT_ERRORS, raise_for_response
from prime_traces.exceptions import APIError, ForbiddenError, RetryableAPIError

from ... import __version__
from .watch import WATCH

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
#: Sample batches and trace uploads are tens of megabytes.
UPLOAD_TIMEOUT = httpx.Timeout(300.0, connect=10.0)

#: Answered before the request did anything. 503 is in the set because the
#: platform answers it while refusing work; a gateway that forwarded and then
#: failed answers 502 or 504.
_REFUSED_STATUSES = frozenset({429, 503})
#: "Not now" answers that prime-traces' mapping leaves as plain errors: the
#: server gave up waiting for the request (408) or will not take it this early
#: (425). Neither acted, and the same request may succeed later.
_NOT_NOW_STATUSES = frozenset({408, 425})


class PlatformError(Exception):
    """A failed platform call.

    ``retryable``: the same call may succeed later (outage, overload).
    ``ambiguous``: the server may have acted although the call failed, so a
    non-idempotent call must not be replayed blindly.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retryable: bool = False,
        ambiguous: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retryable = retryable
        self.ambiguous = ambiguous
        self.retry_after = retry_after


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context (httpx's defaults, ``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` honoured) for every client of the process: loading the
    CA bundle costs about 50 ms of CPU, and httpx does it per client."""
    return httpx.create_ssl_context()


def user_agent() -> str:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"prime-runs-otel/{__version__} python/{python}"


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN is refused here rather than as an opaque 400."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def classify_transport_error(exc: httpx.RequestError, what: str) -> PlatformError:
    ambiguous = isinstance(exc, AMBIGUOUS_TRANSPORT_ERRORS)
    return PlatformError(
        f"{what} failed: {type(exc).__name__}: {exc}", retryable=True, ambiguous=ambiguous
    )


def classify_response(response: httpx.Response, what: str) -> PlatformError | None:
    """``None`` for a success; otherwise the failure, classified."""
    try:
        raise_for_response(response)
    except RetryableAPIError as exc:
        status = exc.status_code
        return PlatformError(
            f"{what} answered {status}: {exc}",
            status=status,
            code=exc.code,
            retryable=True,
            ambiguous=status not in _REFUSED_STATUSES,
            retry_after=exc.retry_after,
        )
    except ForbiddenError as exc:
        return PlatformError(f"{what} answered 403: {exc}", status=403, code=exc.code)
    except APIError as exc:
        status = getattr(exc, "status_code", None) or response.status_code
        # Any other server error may be transient, and may have acted.
        server_side = status >= 500
        return PlatformError(
            f"{what} answered {status}: {exc}{_redirect_note(response)}",
            status=status,
            code=getattr(exc, "code", None),
            retryable=server_side or status in _NOT_NOW_STATUSES,
            ambiguous=server_side,
        )
    return None


def _redirect_note(response: httpx.Response) -> str:
    """Where a redirect points: requests here are never redirected (a POST
    body would be lost or sent where nobody checked), so the address set is
    what has to change."""
    if not response.is_redirect:
        return ""
    location = response.headers.get("Location")
    return f" (redirected to {location})" if location else " (a redirect)"


class PlatformClient:
    """Bearer-authenticated JSON calls under ``{origin}/api/v1``."""

    def __init__(self, *, api_key: str, base_url: str, team_id: str | None = None) -> None:
        self.team_id = team_id
        self._client = httpx.Client(
            base_url=f"{base_url.rstrip('/')}/api/v1",
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": user_agent()},
            timeout=DEFAULT_TIMEOUT,
            verify=tls_context(),
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> dict[str, Any]:
        """Send once; the decoded JSON object, or :class:`PlatformError`."""
        what = f"{method} {path}"
        data = content if content is not None else (None if body is None else encode_json(body))
        headers = {"Content-Type": "application/json"} if data is not None else None
        return send_once(
            lambda: self._client.request(
                method,
                path,
                content=data,
                headers=headers,
                params=params,
                timeout=timeout or DEFAULT_TIMEOUT,
            ),
            what,
        )

    def close(self) -> None:
        self._client.close()


def send_once(send: Callable[[], httpx.Response], what: str) -> dict[str, Any]:
    """Make one request (``send``) and read its answer: the decoded JSON
    object, or :class:`PlatformError` saying whether it may be retried and
    whether it may have acted. Every JSON API of the platform answers alike."""
    try:
        with WATCH.waiting(what):
            response = send()
    except httpx.RequestError as exc:
        raise classify_transport_error(exc, what) from exc
    WATCH.answered()
    failure = classify_response(response, what)
    if failure is not None:
        raise failure
    return decode_response(response, what)


def decode_response(response: httpx.Response, what: str) -> dict[str, Any]:
    """A successful answer's JSON object (a bare array or value under
    ``data``); an empty body is an empty object."""
    if not response.content:
        return {}
    try:
        payload = response.json()
    except ValueError:
        raise PlatformError(
            f"{what} answered {response.status_code} with a body that is not JSON: "
            f"{response.text[:200]!r}",
            status=response.status_code,
        ) from None
    return payload if isinstance(payload, dict) else {"data": payload}
