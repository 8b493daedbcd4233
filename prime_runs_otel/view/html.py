"""The pages' common parts: the templates' environment, the addresses of
the viewer's own pages, and how values are written into a page.

Everything a page shows of a run comes from its producer (names, error
messages, whole conversations), so the templates escape every value by
default (Jinja2's autoescape: a value is markup only when built as such),
and :func:`visible` runs on every value first: controls and the
bidirectional overrides that reorder what a reader sees (a run named
``report\\u202eexe.txt`` read as ``reporttxt.exe``) become visible escapes,
as the command line prints them. Pages carry no inline script or style
(the Content-Security-Policy forbids them): scripts and styles are the
package's own files under ``static/``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from .. import __version__

__all__ = ["DASH", "Markup", "qs", "render", "segment", "url", "visible"]

#: What a missing value shows as.
DASH = "\u2013"

#: C0 controls but tab and newline, DEL, C1 controls, lone surrogates, and
#: the marks and overrides that change the direction of what follows.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(value: object) -> object:
    """``value`` with every character that would hide or reorder text as a
    visible escape (markup built by the viewer itself passes as it is)."""
    if value is None:
        return DASH
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return value if _UNSAFE.search(value) is None else _UNSAFE.sub(_escape, value)


def url(*segments: str) -> str:
    """A path of this viewer, each segment quoted whole, so that an id holding
    ``/``, ``%`` or anything else comes back exactly from :func:`segment`.

    A browser resolves a segment ``.`` or ``..`` (also written ``%2e``) as a
    step up the path, so those two, and the empty id, are written with a
    ``~`` in front; ``~`` itself is always quoted, so no other id starts so.
    """
    return "/" + "/".join(_segment_of(value) for value in segments)


def _segment_of(value: str) -> str:
    if value in ("", ".", ".."):
        return "~" + value
    return quote(value, safe="").replace("~", "%7E")


def segment(raw: str) -> str:
    """The id a segment of :func:`url` names, decoded once."""
    if raw in ("~", "~.", "~.."):
        return raw[1:]
    return unquote(raw)


def qs(path: str, params: Mapping[str, object] | Iterable[tuple[str, object]]) -> str:
    """``path`` with query parameters (``None`` and empty values left out)."""
    pairs = params.items() if isinstance(params, Mapping) else params
    kept = [(name, str(value)) for name, value in pairs if value is not None and value != ""]
    return f"{path}?{urlencode(kept)}" if kept else path


def number(value: Any) -> str:
    return DASH if not isinstance(value, (int, float)) else f"{value:.4f}"


def pct(share: float | None) -> str:
    return DASH if share is None else f"{100 * share:.1f} %"


def seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def when(stamp: float | None) -> str:
    return DASH if not stamp else time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def _environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("prime_runs_otel.view", "templates"),
        autoescape=True,
        finalize=visible,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(number=number, pct=pct, seconds=seconds, visible=visible)
    environment.globals.update(url=url, qs=qs, version=__version__, DASH=DASH)
    return environment


_ENVIRONMENT = _environment()


def render(template: str, **context: Any) -> str:
    """A page (or part of one) from its template in ``templates/``;
    ``charts``: the page draws curves (it loads the chart library)."""
    context.setdefault("charts", False)
    return _ENVIRONMENT.get_template(template).render(**context)
