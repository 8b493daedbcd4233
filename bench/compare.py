"""Every figure that moved by more than 5 % between two `make bench` results.

    python bench/compare.py OLD NEW [--threshold 5]

OLD and NEW are commits with a file in bench/results/ (as `make bench` writes
them) or paths of such files; NEW defaults to the commit at hand
(`make bench-compare BASE=<commit>`). A report to read before committing,
not a test: on a shared machine CPU figures move by about 10 % between runs
and wall-clock figures by more, so each side's load is printed beside it, and
a figure that moved is a reason to measure again (interleaved, or in
instructions), not a verdict.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import results

#: Figures where more is better (everything else here is a cost).
HIGHER_IS_BETTER = ("per_s", "achieved", "delivered")


def moved(old: dict[str, Any], new: dict[str, Any], threshold: float) -> list[str]:
    """One line per figure of both files that moved by more than ``threshold`` %."""
    lines = []
    old_figures, new_figures = old["figures"], new["figures"]
    for name in sorted(set(old_figures) & set(new_figures)):
        before, after = old_figures[name]["value"], new_figures[name]["value"]
        if before is None or after is None or not math.isfinite(before + after):
            continue
        if before == after:
            continue
        change = math.inf if before == 0 else 100.0 * (after - before) / abs(before)
        if abs(change) <= threshold:
            continue
        better = (change > 0) == any(word in name for word in HIGHER_IS_BETTER)
        unit = new_figures[name].get("unit", "")
        lines.append(
            f"{name:<60} {before:>12.4g} -> {after:<12.4g} {unit:<10} "
            f"{change:+7.1f} %  {'better' if better else 'worse'}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="commit or results file measured before")
    parser.add_argument(
        "new", nargs="?", help="commit or results file (default: the commit at hand)"
    )
    parser.add_argument("--threshold", type=float, default=5.0, help="percent (default 5)")
    args = parser.parse_args(argv)
    old = results.read(args.old)
    new = results.read(args.new or results.commit())
    for label, document in (("old", old), ("new", new)):
        load = ", ".join(f"{value:g}" for value in document.get("load", [])) or "unknown"
        print(f"{label}: {document['commit']} ({document['date']}; load {load})")
    lines = moved(old, new, args.threshold)
    only_old = sorted(set(old["figures"]) - set(new["figures"]))
    only_new = sorted(set(new["figures"]) - set(old["figures"]))
    print(f"\n{len(lines)} figure(s) moved by more than {args.threshold:g} %:")
    for line in lines:
        print(f"  {line}")
    if only_old or only_new:
        print(f"\nmeasured on one side only: {len(only_old)} old, {len(only_new)} new")
        for name in only_old:
            print(f"  old only: {name}")
        for name in only_new:
            print(f"  new only: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
