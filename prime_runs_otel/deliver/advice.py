"""What a user does next about a run whose delivery stopped for good.

A permanent refusal is known within a second, and retrying cannot fix it, so
the reason alone is not enough: ``finish()``, ``replay``, ``show`` and
``push`` all print the one step that moves the run on, and it must be a step
that works for that reason (a new key does not fix a missing environment).
"""

from __future__ import annotations

from ..config import key_hint


def next_step(local_id: str, error: str | None) -> str:
    """The command (or setting) that gets a stopped run delivered, or removed."""
    text = (error or "").lower()
    push = f"`prime-runs-otel push {local_id}`"
    if "401" in text or "api key" in text or "unauthorized" in text:
        return f"check the API key ({key_hint()}; `prime-runs-otel doctor` tests it), then {push}"
    if "environment" in text:
        return (
            "name an environment that exists: "
            f"`prime-runs-otel push {local_id} --environment OWNER/NAME` "
            f"(or drop the run: `prime-runs-otel rm {local_id}`)"
        )
    if "answered 404" in text or "answered 405" in text or "redirect" in text:
        setting = "PRIME_TRACES_URL" if "prime traces" in text else "PRIME_API_BASE_URL"
        return (
            f"check {setting} (`prime-runs-otel doctor` tests it; unset it for the default), "
            f"then {push}; if the run was deleted on the platform, drop it: "
            f"`prime-runs-otel rm {local_id}`"
        )
    if "403" in text:
        return (
            "the key has no access to this team or feature: check PRIME_TEAM_ID and the key's "
            f"scopes, then {push}"
        )
    return f"fix the cause, then {push} (or drop the run: `prime-runs-otel rm {local_id}`)"
