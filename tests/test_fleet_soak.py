"""The fleet soak (``fleet_soak.py``): producers, the load balancer, gateway +
``serve`` backends sharing a fleet folder, the fake platform; random kill -9
of serve, gateway and load balancer, a backend added and another removed
mid-run; exact books per run. Short here; ``make soak-fleet`` runs it long
(``SOAK_FLEET_*`` settings)."""

from __future__ import annotations

import os
from pathlib import Path

from fleet_soak import Plan, plan_from, soak

from prime_runs_otel.testing import FakePlatform


def test_a_fleet_under_kills_and_resharding_delivers_every_run_whole_and_once(
    tmp_path: Path, platform: FakePlatform
) -> None:
    long = os.environ.get("SOAK_FLEET") == "long"
    if long:
        plan = plan_from(
            lambda name, default: os.environ.get(f"SOAK_FLEET_{name.upper()}", default)
        )
        budget = float(os.environ.get("SOAK_FLEET_BUDGET", "900"))
    else:
        plan, budget = Plan(runs=6, episodes=40, blow_every=1.5), 120.0
    happened = soak(tmp_path, platform, plan, budget=budget)
    print("blows:", "; ".join(happened))
