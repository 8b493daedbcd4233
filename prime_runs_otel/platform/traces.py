"""Prime Traces uploads: one content-addressed request at a time.

The bytes and their idempotency key are built (and persisted) by the
uploader before the first attempt, so a replay after a crash or a lost
answer sends exactly the same request and the service answers with the
receipt it already committed instead of storing the episodes twice.
"""

from __future__ import annotations

from typing import Any

from prime_traces import LineFormat
from prime_traces.core import TracesAPIClient
from prime_traces.exceptions import APIError, RetryableAPIError, TransportError

from .http import UPLOAD_TIMEOUT, PlatformError, user_agent

SERVICE_NOT_ENABLED = "service_not_enabled"


class TracesAPI:
    def __init__(self, *, api_key: str, traces_url: str, team_id: str | None) -> None:
        self._client = TracesAPIClient(
            api_key=api_key,
            base_url=traces_url,
            team_id=team_id or "",
            user_agent=user_agent(),
            timeout=UPLOAD_TIMEOUT,
        )

    def upload_episodes(self, body: bytes, key: str, context: dict[str, str]) -> dict[str, Any]:
        """Send one upload of episode lines; the receipt, or :class:`PlatformError`.

        Every failure of an upload is safe to replay (content addressing), so
        transport errors and 5xx are all *retryable*; a 403 is not, and its
        code tells a disabled account (``service_not_enabled``) from a
        credential without the traces scope.
        """
        try:
            return self._client.upload_batch(
                body, key, line_format=LineFormat.EPISODE, context=context or None
            )
        except RetryableAPIError as exc:
            raise PlatformError(
                f"Prime Traces upload answered {exc.status_code}: {exc}",
                status=exc.status_code,
                code=exc.code,
                retryable=True,
                retry_after=exc.retry_after,
            ) from exc
        except TransportError as exc:
            raise PlatformError(f"Prime Traces upload failed: {exc}", retryable=True) from exc
        except APIError as exc:
            status = exc.status_code
            raise PlatformError(
                f"Prime Traces upload answered {status}: {exc}",
                status=status,
                code=exc.code,
                retryable=bool(status and status >= 500),
            ) from exc

    def close(self) -> None:
        self._client.close()
