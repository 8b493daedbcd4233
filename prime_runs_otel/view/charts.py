"""Charts as inline SVG, drawn on the server.

Server-side SVG rather than a JavaScript charting library: the spool has
already reduced every chart to a few hundred numbers, so drawing them is a
few dozen lines of arithmetic; a page then needs no script to show its
charts (they are in the HTML, in screenshots, in a saved page), there is no
third-party code to vendor, audit and upgrade, and every label goes through
the same escaping as the rest of the page. What SVG gives up (zooming,
panning) the pages make up for with links: a bar of a reward distribution
opens the episodes in its range. Hovering a bar or a point shows its value
(an SVG ``<title>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from .distributions import Bin, Distribution
from .html import visible


def _esc(value: str) -> str:
    """Text escaped, with what would reorder it shown as escapes."""
    return escape(str(visible(value)))


__all__ = ["PALETTE", "bars", "grouped_bars", "lines", "scatter"]

#: One colour per run or series, in order (readable on white, and apart).
PALETTE = ("#2f6fde", "#e0892b", "#2c9c69", "#c1447b", "#7a5bd1", "#7d7d7d")
WIDTH = 560
HEIGHT = 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 12, 10, 30


def number(value: float) -> str:
    """A value short enough for an axis label."""
    if value == 0:
        return "0"
    if abs(value) >= 10_000 or abs(value) < 0.001:
        return f"{value:.3g}"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def _frame(body: list[str], label: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{_esc(label)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )


def _axes(
    body: list[str],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    *,
    x_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> None:
    bottom = height - _BOTTOM
    body.append(
        f'<line class="axis" x1="{_LEFT}" y1="{bottom}" x2="{width - _RIGHT}" y2="{bottom}"/>'
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}"/>'
    )
    for value, y in ((y_range[0], bottom), (y_range[1], _TOP + 8)):
        body.append(
            f'<text class="tick" x="{_LEFT - 4}" y="{y}" text-anchor="end">'
            f"{_esc(number(value))}</text>"
        )
    body.append(
        f'<text class="tick" x="{_LEFT}" y="{height - 14}">{_esc(number(x_range[0]))}</text>'
        f'<text class="tick" x="{width - _RIGHT}" y="{height - 14}" text-anchor="end">'
        f"{_esc(number(x_range[1]))}</text>"
        f'<text class="label" x="{(width + _LEFT) / 2}" y="{height - 2}" text-anchor="middle">'
        f"{_esc(x_label)}</text>"
    )


def bars(
    shape: Distribution,
    *,
    label: str,
    link: Callable[[Bin], str] | None = None,
    unit: str = "",
) -> str:
    """A distribution's bars; ``link`` makes each bar a link (to the
    episodes in its range, say)."""
    return grouped_bars([shape], label=label, link=link, unit=unit)


def grouped_bars(
    shapes: Sequence[Distribution | None],
    *,
    label: str,
    link: Callable[[Bin], str] | None = None,
    unit: str = "",
    names: Sequence[str] = (),
) -> str:
    """Several distributions binned alike (``distribution(span=...)``), their
    bars side by side in :data:`PALETTE` order."""
    present = [shape for shape in shapes if shape is not None]
    body: list[str] = []
    if not present:
        return ""
    bins = len(present[0].bins)
    top = max(item.count for shape in present for item in shape.bins) or 1
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM
    slot = plot_width / bins
    bar_width = max(1.0, (slot - 2) / max(1, len(shapes)))
    for index, shape in enumerate(shapes):
        if shape is None:
            continue
        color = PALETTE[index % len(PALETTE)]
        for position, item in enumerate(shape.bins):
            height = plot_height * item.count / top
            x = _LEFT + position * slot + 1 + index * bar_width
            y = HEIGHT - _BOTTOM - height
            who = f"{names[index]}: " if index < len(names) else ""
            span = (
                f"{number(item.low)}{unit}"
                if item.low == item.high
                else f"{number(item.low)} to {number(item.high)}{unit}"
            )
            rect = (
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_width:.1f}" height="{height:.1f}" '
                f'fill="{color}"><title>{_esc(f"{who}{span}: {item.count}")}</title></rect>'
            )
            if link is not None and item.count:
                rect = f'<a href="{_esc(link(item))}">{rect}</a>'
            body.append(rect)
    low = min(shape.bins[0].low for shape in present)
    high = max(shape.bins[-1].high for shape in present)
    _axes(body, (low, high), (0, top), x_label=label)
    return _frame(body, label)


def lines(
    x: Sequence[float],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    label: str,
    x_label: str,
) -> str:
    """One or more series over ``x``, each a polyline in :data:`PALETTE`
    order, broken where a value is missing, with a legend."""
    values = [value for _, ys in series for value in ys if value is not None]
    if not x or not values:
        return ""
    low, high = min(values), max(values)
    if low == high:
        low, high = low - 0.5, high + 0.5
    x_low, x_high = min(x), max(x)
    span = (x_high - x_low) or 1.0
    plot_width = WIDTH - _LEFT - _RIGHT
    plot_height = HEIGHT - _TOP - _BOTTOM

    def at(x_value: float, y_value: float) -> str:
        px = _LEFT + plot_width * (x_value - x_low) / span
        py = HEIGHT - _BOTTOM - plot_height * (y_value - low) / (high - low)
        return f"{px:.1f},{py:.1f}"

    body: list[str] = []
    for index, (name, ys) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for x_value, y_value in zip(x, ys, strict=True):
            if y_value is None or not math.isfinite(y_value):
                runs.append([])
                continue
            runs[-1].append(at(x_value, y_value))
        for points in runs:
            if len(points) == 1:
                cx, cy = points[0].split(",")
                body.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif points:
                body.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                    f'points="{" ".join(points)}"><title>{_esc(name)}</title></polyline>'
                )
        if len(series) > 1:
            body.append(
                f'<text class="legend" x="{_LEFT + 6 + 120 * index}" y="{_TOP + 4}" '
                f'fill="{color}">{_esc(name[:18])}</text>'
            )
    _axes(body, (x_low, x_high), (low, high), x_label=x_label)
    return _frame(body, label)


def scatter(
    points: Sequence[tuple[str, float, float]],
    *,
    label: str,
    x_label: str,
    y_label: str,
    link: Callable[[str], str] | None = None,
) -> str:
    """``(name, x, y)`` points on one scale for both axes, with the
    diagonal where x = y."""
    if not points:
        return ""
    size = HEIGHT + 60
    values = [value for _, x, y in points for value in (x, y)]
    low, high = min(values), max(values)
    if low == high:
        low, high = low - 0.5, high + 0.5
    plot = size - _TOP - _BOTTOM

    def at(value: float, *, vertical: bool) -> float:
        share = (value - low) / (high - low)
        return size - _BOTTOM - plot * share if vertical else _LEFT + plot * share

    start = f'x1="{at(low, vertical=False):.1f}" y1="{at(low, vertical=True):.1f}"'
    end = f'x2="{at(high, vertical=False):.1f}" y2="{at(high, vertical=True):.1f}"'
    body = [f'<line class="diagonal" {start} {end}/>']
    for name, x, y in points:
        dot = (
            f'<circle cx="{at(x, vertical=False):.1f}" cy="{at(y, vertical=True):.1f}" r="2.5" '
            f'fill="{PALETTE[0]}" fill-opacity="0.5"><title>'
            f"{_esc(f'example {name}: {number(x)} / {number(y)}')}</title></circle>"
        )
        if link is not None:
            dot = f'<a href="{_esc(link(name))}">{dot}</a>'
        body.append(dot)
    width = _LEFT + plot + _RIGHT
    _axes(body, (low, high), (low, high), x_label=x_label, width=width, height=size)
    body.append(
        f'<text class="label" x="12" y="{size / 2}" transform="rotate(-90 12 {size / 2})" '
        f'text-anchor="middle">{_esc(y_label)}</text>'
    )
    return _frame(body, label, width=width, height=size)
