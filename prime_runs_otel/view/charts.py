"""Distributions and the per-example scatter as inline SVG, drawn on the
server.

These are the charts whose every mark is a link: a bar of a distribution
opens the episodes in its range, a point of the scatter its example. As SVG
in the page they are links like any other, need no script, and every label
goes through the same escaping as the rest of the page; hovering a bar or a
point shows its value (an SVG ``<title>``). The curves over a run, where
people zoom, smooth and switch axes, are drawn in the browser instead
(``static/charts.js`` with uPlot, from :mod:`.chart_data`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from .distributions import Bin, Distribution
from .html import visible


def _esc(value: str) -> str:
    """Text escaped, with what would reorder it shown as escapes."""
    return escape(str(visible(value)))


def _label(value: str, limit: int = 48) -> str:
    """A label short enough to fit under a chart."""
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


__all__ = ["PALETTE", "bars", "grouped_bars", "scatter"]

#: One colour per run or series, in order (readable on white, and apart).
PALETTE = ("#2f6fde", "#e0892b", "#2c9c69", "#c1447b", "#7a5bd1", "#7d7d7d")
WIDTH = 640
HEIGHT = 200
#: Room for the axis labels: a tick such as -0.03483 or 1.23e+05 fits whole.
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 16, 10, 30


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
        f"{_esc(_label(x_label))}</text>"
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
        f'text-anchor="middle">{_esc(_label(y_label, 32))}</text>'
    )
    return _frame(body, label, width=width, height=size)
