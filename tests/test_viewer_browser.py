"""The viewer in a real browser: Debian's Chromium, driven by Playwright,
clicking through runs → run → episodes → episode → compare on a demo-like
eval run and a training run, as a person would.

Chromium must be there (``make test`` installs it where missing): without
it these tests fail, they are not skipped. It is launched with the flags
that keep it from reaching out to the network it would otherwise call
(updates, sync, QUIC), which this test needs none of.

Each step is photographed; with ``PRIME_RUNS_OTEL_SCREENSHOTS=DIR`` the
pictures are kept in DIR (docs/images holds the ones docs/viewer.md shows).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright import sync_api as playwright_api
from viewer_runs import EVAL_EPISODES, TRAIN_STEPS, open_spool, record_eval, record_training

import prime_runs_otel as pro
from prime_runs_otel.cli.arguments import parse_since
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.view.server import ViewerServer

# Read on import: every test's environment is cleared of PRIME_* settings.
CHROMIUM = os.environ.get("PRIME_RUNS_OTEL_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("PRIME_RUNS_OTEL_SCREENSHOTS")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[playwright_api.Browser]:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.fail(
            f"Chromium is not at {CHROMIUM}: `make test` installs it (apt-get install chromium), "
            "or point PRIME_RUNS_OTEL_CHROMIUM at one"
        )
    with playwright_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def viewer(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    spool_dir = tmp_path / "spool"
    runs = {
        "eval": record_eval(spool_dir),
        "other": record_eval(spool_dir, name="demo-eval-2", seed=1),
        "train": record_training(spool_dir),
    }
    spool = open_spool(spool_dir)
    with ViewerServer(spool, port=0, since=parse_since) as server:
        yield server.url, runs
    spool.close()


def _shoot(page: playwright_api.Page, name: str, tmp_path: Path) -> None:
    folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"viewer-{name}.png"
    page.screenshot(path=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_run_episodes_episode_and_compare(
    browser: playwright_api.Browser, viewer: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, runs = viewer
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))

    page.goto(url)
    expect = playwright_api.expect
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.locator("table.runs tbody tr")).to_have_count(3)
    expect(page.locator("#live-status")).to_contain_text("updated")  # the script polls
    _shoot(page, "runs", tmp_path)

    page.get_by_role("link", name="demo-eval", exact=True).click()
    expect(page.locator("h1")).to_have_text("demo-eval")
    expect(page.locator("figure[data-chart=reward] svg rect").first).to_be_visible()
    expect(page.locator("section.errors")).to_contain_text("ProviderTimeout")
    expect(page.locator("figure[data-chart='reward over the run'] polyline")).to_have_count(1)
    _shoot(page, "run", tmp_path)

    page.locator("section.errors").get_by_role("link", name="ProviderTimeout").click()
    expect(page.locator("p.count")).to_contain_text("episode(s) match")
    rows = page.locator("table.episodes tbody tr")
    assert rows.count() > 0
    for index in range(rows.count()):
        expect(rows.nth(index)).to_contain_text("ProviderTimeout")

    page.get_by_role("link", name="clear").click()
    expect(page.locator("p.count")).to_contain_text(f"{EVAL_EPISODES} episode(s) match")
    page.get_by_role("link", name="reward").click()  # sort by reward, highest first
    expect(page).to_have_url(re.compile(r"sort=reward"))
    _shoot(page, "episodes", tmp_path)
    page.locator("table.episodes tbody tr").first.locator("td a.mono").click()
    expect(page.locator("h1")).to_contain_text("Episode")
    expect(page.locator("section.trace").first).to_contain_text("solver")
    expect(page.locator(".message.role-assistant").first).to_be_visible()
    expect(page.locator(".message.role-user").first).to_contain_text("buys")
    _shoot(page, "episode", tmp_path)

    page.get_by_role("link", name="runs", exact=True).click()
    page.locator(f"input[value='{runs['eval']}']").check()
    page.locator(f"input[value='{runs['other']}']").check()
    page.get_by_role("button", name="compare the ticked runs").click()
    expect(page.locator("h1")).to_have_text("Compare runs")
    expect(page.locator("figure[data-chart=rewards] rect").first).to_be_visible()
    expect(page.locator("figure[data-chart=examples] circle").first).to_be_visible()
    expect(page.locator("main")).to_contain_text(f"{EVAL_EPISODES // 4} example(s) rewarded")
    _shoot(page, "compare", tmp_path)
    assert not errors, errors
    page.close()


def test_a_training_run_charts_its_steps(
    browser: playwright_api.Browser, viewer: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, _ = viewer
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    page.goto(url + "/?kind=train")
    expect = playwright_api.expect
    expect(page.locator("table.runs tbody tr")).to_have_count(1)
    page.get_by_role("link", name="demo-train", exact=True).click()
    expect(page.locator("h1")).to_have_text("demo-train")
    # A training run's curves come first.
    expect(page.locator("section.charts h2").first).to_have_text("Over steps")
    loss = page.locator("figure[data-chart='loss (metrics row)'] polyline")
    expect(loss).to_have_count(1)
    points = loss.get_attribute("points") or ""
    assert len(points.split()) == TRAIN_STEPS
    expect(page.locator("figure[data-chart='reward over steps'] polyline")).to_have_count(1)
    _shoot(page, "training", tmp_path)
    page.get_by_role("link", name="browse the episodes").click()
    expect(page.locator("table.episodes tbody tr td:nth-child(4)").first).to_have_text("0")
    page.close()


def test_a_run_page_follows_the_run_while_it_records(
    browser: playwright_api.Browser, tmp_path: Path
) -> None:
    spool_dir = tmp_path / "spool"
    run = pro.start_run(name="live-run", environments=["gsm8k-demo"], spool_dir=spool_dir)
    try:
        for index in range(10):
            run.record_episode(synthetic_episode(index))
        run.tracer_provider.force_flush()
        spool = open_spool(spool_dir)
        with ViewerServer(spool, port=0) as server:
            page = browser.new_page()
            page.goto(f"{server.url}/runs/{run.id}")
            expect = playwright_api.expect
            expect(page.locator("p.about [data-field=episodes]")).to_have_text("10")
            for index in range(10, 25):
                run.record_episode(synthetic_episode(index))
            run.tracer_provider.force_flush()
            expect(page.locator("p.about [data-field=episodes]")).to_have_text("25", timeout=15_000)
            expect(page.locator("#live-status")).to_contain_text("live")
            page.close()
        spool.close()
    finally:
        run.finish()
