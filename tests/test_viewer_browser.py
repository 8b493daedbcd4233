"""The viewer in a real browser: Debian's Chromium, driven by Playwright,
clicking through runs → run → episodes → episode → compare on a demo-like
eval run and a training run, as a person would; the curves of a training
run (drawn, the value under the pointer, smoothing, log scale, time axis);
an empty store that fills; a narrow window. On every page: no
Content-Security-Policy violation and no console error.

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
from viewer_runs import EVAL_EPISODES, open_spool, record_eval, record_training

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
#: Records every Content-Security-Policy violation of the page (an init
#: script: the browser runs it whatever the page's policy says).
WATCH_POLICY = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(event.violatedDirective + " " + event.blockedURI);
});
"""
expect = playwright_api.expect


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


class Watched:
    """A page whose console errors and policy violations are kept."""

    def __init__(self, browser: playwright_api.Browser, width: int = 1200, height: int = 800):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.page.add_init_script(WATCH_POLICY)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on(
            "console",
            lambda message: (
                message.type in ("error", "warning")
                and self.errors.append(f"{message.type}: {message.text}")
            ),
        )

    def check(self) -> None:
        """No error so far, and no violation on the page shown."""
        violations = self.page.evaluate("window.__violations")
        assert not violations, violations
        assert not self.errors, self.errors

    def close(self) -> None:
        self.check()
        self.page.close()


def _shoot(
    page: playwright_api.Page,
    name: str,
    tmp_path: Path,
    *,
    full: bool = False,
    mask: list[playwright_api.Locator] | None = None,
) -> None:
    """``mask``: parts covered in the picture (this machine's paths)."""
    folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"viewer-{name}.png"
    page.screenshot(path=str(path), full_page=full, mask=mask or [], mask_color="#d0d7de")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_run_episodes_episode_and_compare(
    browser: playwright_api.Browser, viewer: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, runs = viewer
    watched = Watched(browser)
    page = watched.page

    page.goto(url)
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.locator("table.runs tbody tr")).to_have_count(3)
    expect(page.locator("#live-status")).to_contain_text("updated")  # the script polls
    _shoot(page, "runs", tmp_path)
    watched.check()

    page.get_by_role("link", name="demo-eval", exact=True).click()
    expect(page.locator("h1")).to_have_text("demo-eval")
    expect(page.locator("figure[data-chart=reward] svg rect").first).to_be_visible()
    expect(page.locator("section.errors")).to_contain_text("ProviderTimeout")
    expect(page.locator("details.config")).to_contain_text("temperature")
    curves = page.locator(".curves")
    expect(curves).to_have_attribute("data-drawn", re.compile(r"[1-9]"))
    expect(page.locator("figure.curve[data-chart='reward over the run'] canvas")).to_have_count(1)
    _shoot(page, "run", tmp_path, full=True)
    watched.check()

    page.locator("section.errors").get_by_role("link", name="ProviderTimeout").click()
    expect(page.locator("p.count")).to_contain_text("episode(s) match")
    rows = page.locator("table.episodes tbody tr")
    assert rows.count() > 0
    for index in range(rows.count()):
        expect(rows.nth(index)).to_contain_text("ProviderTimeout")
    page.locator("table.episodes tbody tr").first.locator("td a.mono").click()
    expect(page.locator(".problem pre.traceback").first).to_contain_text("Traceback")
    page.go_back()

    page.get_by_role("link", name="clear", exact=True).click()
    expect(page.locator("p.count")).to_contain_text(f"{EVAL_EPISODES} episode(s) match")
    page.get_by_role("link", name="reward").click()  # sort by reward, highest first
    expect(page).to_have_url(re.compile(r"sort=reward"))
    _shoot(page, "episodes", tmp_path)
    page.locator("input[name=page]").fill("3")
    page.get_by_role("button", name="go").click()
    expect(page.locator("p.count")).to_contain_text("page 3 of 3")
    page.locator("table.episodes tbody tr").first.locator("td a.mono").click()
    expect(page.locator("h1")).to_contain_text("Episode")
    expect(page.locator("section.trace").first).to_contain_text("solver")
    expect(page.locator(".message.role-assistant").first).to_be_visible()
    expect(page.locator(".message.role-user").first).to_contain_text("buys")
    _shoot(page, "episode", tmp_path)
    watched.check()

    page.get_by_role("link", name="runs", exact=True).click()
    page.locator(f"input[value='{runs['eval']}']").check()
    page.locator(f"input[value='{runs['other']}']").check()
    page.get_by_role("button", name="compare the ticked runs").click()
    expect(page.locator("h1")).to_have_text("Compare runs")
    expect(page.locator("figure[data-chart=rewards] rect").first).to_be_visible()
    expect(page.locator("figure[data-chart=examples] circle").first).to_be_visible()
    expect(page.locator("main")).to_contain_text(f"{EVAL_EPISODES // 4} example(s) rewarded")
    expect(page.locator("table.compare th.delta").first).to_contain_text("Δ")
    _shoot(page, "compare", tmp_path, full=True)
    watched.close()


def test_a_training_run_draws_its_curves(
    browser: playwright_api.Browser, viewer: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, _ = viewer
    watched = Watched(browser)
    page = watched.page
    page.goto(url + "/?kind=train")
    expect(page.locator("table.runs tbody tr")).to_have_count(1)
    page.get_by_role("link", name="demo-train", exact=True).click()
    expect(page.locator("h1")).to_have_text("demo-train")
    # A training run's curves come first, the loss of its metrics rows among them.
    expect(page.locator("section.charts h2").first).to_have_text("Over steps")
    loss = page.locator("figure.curve[data-chart='loss (metrics row)']")
    expect(loss.locator("canvas")).to_have_count(1)
    expect(page.locator("figure.curve[data-chart='reward over steps'] canvas")).to_have_count(1)

    # The value under the pointer: the legend follows it.
    legend_value = loss.locator(".u-legend .u-series").nth(1).locator(".u-value")
    box = loss.locator(".u-over").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
    expect(legend_value).to_have_text("1")  # step 0: loss 1.0
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    expect(legend_value).not_to_have_text("1")
    _shoot(page, "training", tmp_path)

    # Zoom: dragging across a range narrows the x axis to it.
    page.mouse.move(box["x"] + box["width"] * 0.1, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 20, steps=5)
    page.mouse.up()
    zoomed = page.evaluate("() => [...document.querySelectorAll('figure.curve .u-axis')].length")
    assert zoomed > 0

    controls = page.locator("form.chart-controls")
    controls.locator("input[name=smoothing]").fill("0.9")
    controls.locator("input[name=log]").check()
    controls.locator("select[name=x]").select_option("time")
    expect(loss.locator("canvas")).to_have_count(1)
    expect(page.locator(".curves")).to_have_attribute("data-drawn", re.compile(r"[1-9]"))
    page.get_by_role("link", name="browse the episodes").click()
    page.locator("input[name=step]").fill("2")
    page.get_by_role("button", name="filter").click()
    expect(page.locator("p.count")).to_contain_text("8 episode(s) match")
    watched.close()


def test_an_empty_store_says_so_and_fills_as_runs_arrive(
    browser: playwright_api.Browser, tmp_path: Path
) -> None:
    spool_dir = tmp_path / "spool"
    spool = open_spool(spool_dir)
    with ViewerServer(spool, port=0) as server:
        watched = Watched(browser)
        page = watched.page
        page.goto(server.url)
        expect(page.locator("p.empty")).to_contain_text("is empty")
        expect(page.locator("p.empty")).to_contain_text("prime-runs-otel demo")
        expect(page.locator("code.store-path")).to_have_text(str(spool.path))
        _shoot(page, "empty", tmp_path, mask=[page.locator("code.store-path")])
        record_eval(spool_dir, name="arrived")
        expect(page.locator("table.runs tbody tr")).to_have_count(1, timeout=20_000)
        expect(page.locator("table.runs")).to_contain_text("arrived")
        watched.close()
    spool.close()


def test_a_narrow_window_scrolls_tables_inside_their_box(
    browser: playwright_api.Browser, viewer: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, runs = viewer
    watched = Watched(browser, width=420, height=800)
    page = watched.page
    overflow = "() => document.documentElement.scrollWidth - window.innerWidth"
    for path in ("/", f"/runs/{runs['eval']}", f"/runs/{runs['eval']}/episodes"):
        page.goto(url + path)
        expect(page.locator("h1")).to_be_visible()
        assert page.evaluate(overflow) <= 0, path
        if path == "/":
            _shoot(page, "narrow", tmp_path)
    watched.close()


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
            watched = Watched(browser)
            page = watched.page
            page.goto(f"{server.url}/runs/{run.id}")
            expect(page.locator("p.about [data-field=episodes]")).to_have_text("10")
            for index in range(10, 25):
                run.record_episode(synthetic_episode(index))
            run.tracer_provider.force_flush()
            expect(page.locator("p.about [data-field=episodes]")).to_have_text("25", timeout=15_000)
            expect(page.locator("#live-status")).to_contain_text("live")
            expect(page.locator(".curves")).to_have_attribute("data-drawn", re.compile(r"[1-9]"))
            watched.close()
        spool.close()
    finally:
        run.finish()
