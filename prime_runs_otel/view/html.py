"""The pages' common parts: the layout around every page, and how values
are written into HTML.

Everything a page shows of a run comes from its producer (names, error
messages, whole conversations), so nothing goes into a page unescaped:
:func:`text` escapes, and the pages build HTML only from it and from
fixed markup. Pages carry no inline script or style (the Content Security
Policy forbids them): the one script and stylesheet are the package's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from html import escape
from urllib.parse import quote, urlencode

from .. import __version__

__all__ = ["Html", "link", "page", "pct", "qs", "seconds", "text", "url"]


#: What a missing value shows as.
DASH = "\u2013"


class Html(str):
    """Markup that is safe as it is: built from fixed text and escaped values."""

    __slots__ = ()


def text(value: object) -> Html:
    """Any value as escaped text; ``None`` as a dash."""
    if isinstance(value, Html):
        return value
    return Html(DASH if value is None else escape(str(value)))


def join(parts: Iterable[str]) -> Html:
    return Html("".join(parts))


def url(*segments: str) -> str:
    """A path of this viewer, each segment quoted whole (ids may hold '/')."""
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


def qs(path: str, params: Mapping[str, object] | Iterable[tuple[str, object]]) -> str:
    """``path`` with query parameters (``None`` values left out)."""
    pairs = params.items() if isinstance(params, Mapping) else params
    kept = [(name, str(value)) for name, value in pairs if value is not None and value != ""]
    return f"{path}?{urlencode(kept)}" if kept else path


PREVIOUS = Html("&lsaquo; previous")
NEXT = Html("next &rsaquo;")


def link(href: str, label: object, *, css: str = "") -> Html:
    kind = f' class="{css}"' if css else ""
    return Html(f'<a href="{escape(href)}"{kind}>{text(label)}</a>')


def pct(share: float | None) -> str:
    return DASH if share is None else f"{100 * share:.1f} %"


def seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def when(stamp: float | None) -> str:
    return DASH if not stamp else time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def page(title: str, body: Html, *, crumbs: Iterable[tuple[str, str]] = (), live: str = "") -> Html:
    """A whole page. ``live`` is the status address the page's script polls
    while a run records (empty: the page is not live)."""
    trail = [link("/", "runs")]
    trail += [link(href, label) for href, label in crumbs]
    live_attribute = f' data-live="{escape(live)}"' if live else ""
    return Html(
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{text(title)} · prime-runs-otel</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/viewer.css">'
        '<script src="/static/viewer.js" defer></script>'
        f"</head><body{live_attribute}>"
        f'<header><span class="brand">prime-runs-otel</span> <nav>{" &rsaquo; ".join(trail)}</nav>'
        '<span class="live-status" id="live-status"></span></header>'
        f"<main>{body}</main>"
        f"<footer>prime-runs-otel {escape(__version__)} · read-only view of the local store"
        "</footer></body></html>"
    )


def table(headers: Iterable[object], rows: Iterable[Iterable[object]], *, css: str = "") -> Html:
    kind = f' class="{css}"' if css else ""
    head = "".join(f"<th>{text(header)}</th>" for header in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{text(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return Html(f"<table{kind}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def notice(message: object, *, css: str = "note") -> Html:
    return Html(f'<p class="{css}">{text(message)}</p>')
