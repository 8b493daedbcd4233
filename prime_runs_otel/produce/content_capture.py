"""Whether message content goes on model-call spans, as
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says.

The same switch every GenAI instrumentation honours, read the same way, so
one setting decides for all of a process's spans. Content is personal data:
an unknown value captures nothing, and says so.
"""

from __future__ import annotations

import logging
import os

from .. import semconv as sc

__all__ = ["NO_CAPTURE", "capture_content_enabled", "capture_content_mode"]


logger = logging.getLogger(__name__)

#: ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` → (on the span, on an
#: event). The current GenAI utilities take the first four (and only them once
#: ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``); the older
#: true/false spelling is taken everywhere, since refusing it captures nothing.
_CAPTURE_MODES: dict[str, tuple[bool, bool]] = {
    "span_only": (True, False),
    "event_only": (False, True),
    "span_and_event": (True, True),
    "no_content": (False, False),
    "true": (True, False),
    "1": (True, False),
    "yes": (True, False),
    "on": (True, False),
    "false": (False, False),
    "0": (False, False),
    "no": (False, False),
    "off": (False, False),
    "": (False, False),
}
NO_CAPTURE = (False, False)
_warned_capture_values: set[str] = set()


def capture_content_enabled() -> bool:
    """Whether message content goes on model-call spans or their events (the GenAI switch)."""
    return capture_content_mode() != NO_CAPTURE


def capture_content_mode() -> tuple[bool, bool]:
    """``(on spans, on events)`` as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
    says. An unknown value captures nothing, and says so once: content is
    personal data, so a typo must not turn it on, nor silently leave it off."""
    raw = os.environ.get(sc.CAPTURE_MESSAGE_CONTENT_ENV, "").strip().lower()
    mode = _CAPTURE_MODES.get(raw)
    if mode is not None:
        return mode
    if raw not in _warned_capture_values:
        _warned_capture_values.add(raw)
        logger.warning(
            "%s=%r is not a value prime-runs-otel knows: message content stays off the "
            "spans. Use span_only, event_only, span_and_event or no_content (or true/false).",
            sc.CAPTURE_MESSAGE_CONTENT_ENV,
            raw,
        )
    return NO_CAPTURE
