"""Reading the fields of a platform API request, as strictly as the platform.

The platform validates every body and answers a malformed one with 422 and
the field's name. A fake that took anything would let a client ship a
payload the real service refuses, so each service reads its fields through
these, and a wrong type fails the same way here as there.
"""

from __future__ import annotations

from typing import Any

from ._http import JSONObject, Request, unprocessable


def required_str(body: JSONObject, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise unprocessable(f"`{key}` is required and must be a non-empty string")
    return value


def optional_str(body: JSONObject, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise unprocessable(f"`{key}` must be a string")
    return value


def optional_object(body: JSONObject, key: str) -> JSONObject | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise unprocessable(f"`{key}` must be a JSON object")
    return value


def required_int(body: JSONObject, key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise unprocessable(f"`{key}` is required and must be an integer")
    return value


def environment_refs(value: Any, *, required: bool) -> list[JSONObject]:
    if not isinstance(value, list) or (required and not value):
        raise unprocessable("`environments` must be a list of {id} objects with at least one entry")
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            raise unprocessable(f"environment reference {entry!r} has no string `id`")
    return [dict(entry) for entry in value]


def query_int(request: Request, name: str, default: int) -> int:
    raw = request.param(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise unprocessable(f"query parameter `{name}` must be an integer") from exc
    if value < 0:
        raise unprocessable(f"query parameter `{name}` must not be negative")
    return value
