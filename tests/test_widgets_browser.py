"""The notebook views, exported and opened in a real headless Chromium.

Each view is exported with `ipywidgets.embed.embed_minimal_html` — what a saved notebook's
widget state or an exported page holds: no kernel answers there — and the widget HTML
manager (`@jupyter-widgets/html-manager` from npm, pinned in tests/browser/package.json) is
served from 127.0.0.1 with the page. Debian's Chromium, driven by Playwright, must render
it with no console error and no failed request: the profile (table, bars, tabs), the
on-demand/spot toggle switching every part in the page alone, the narrow 640 px layout
(tables scroll inside the view, the page does not), and the forecast's own view. The
profile's screenshot is kept in tests/artifacts/widget.png and copied to docs/img/ for the
README. `make browser-deps` installs what this needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# One xdist worker runs the module: the browser starts once, in the module's fixture.
pytestmark = pytest.mark.xdist_group("browser")
BROWSER_DIR = ROOT / "tests" / "browser"
DIST = BROWSER_DIR / "node_modules" / "@jupyter-widgets" / "html-manager" / "dist"
ARTIFACTS = ROOT / "tests" / "artifacts"
ARTIFACT = ARTIFACTS / "widget.png"
README_IMAGE = ROOT / "docs" / "img" / "profile-widget.png"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

sys.path.insert(0, str(BROWSER_DIR))
from serve import serve  # noqa: E402  (the helper lives next to the npm pin)


def chromium_path() -> str | None:
    return shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )


def caret_allows(spec: str, version: str) -> bool:
    """Whether `version` satisfies an npm caret range like "^1.0.1"."""
    want = [int(x) for x in spec.lstrip("^~=").split(".")]
    have = [int(x) for x in version.split(".")]
    return have[0] == want[0] and have >= want


def test_npm_pin_matches_the_html_manager_ipywidgets_expects():
    from ipywidgets._version import __html_manager_version__

    pinned = json.loads((BROWSER_DIR / "package.json").read_text())["dependencies"][
        "@jupyter-widgets/html-manager"
    ]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned), "pin an exact version"
    assert caret_allows(__html_manager_version__, pinned)
    lock = json.loads((BROWSER_DIR / "package-lock.json").read_text())
    locked = lock["packages"]["node_modules/@jupyter-widgets/html-manager"]["version"]
    assert locked == pinned


@pytest.fixture(scope="module")
def result():
    """A real CPU profile of a small training step, compared with TPUs and GPUs."""
    from gpu2tpu import profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 128)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 128)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()

    return profile(
        train_step,
        steps=12,
        warmup=3,
        backend="cpu",
        samples_per_step=64,
        tokens_per_step=64 * 128,
        dataset_size=100_000,
        targets=["v5e", "v6e", "v5p", "tpu7x", "a100-80gb", "h100"],
    )


class Browser:
    """An exported view served on 127.0.0.1 and open in Chromium, with everything that
    went wrong recorded (console errors, failed requests)."""

    def __init__(self, page, served, errors, failed):  # type: ignore[no-untyped-def]
        self.page = page
        self.served = served
        self.errors = errors
        self.failed = failed

    def check_clean(self) -> None:
        missing = [f"{p} ({status})" for p, status in self.served.requests if status >= 400]
        assert self.failed == [] and missing == [], f"failed requests: {self.failed + missing}"
        assert self.errors == [], f"console errors: {self.errors}"


@contextmanager
def opened(view, tmp_path: Path, *, width: int = 1360) -> Iterator[Browser]:  # type: ignore[no-untyped-def]
    """Export `view` as a page, serve it and open it in headless Chromium."""
    if not (DIST / "embed.js").exists():
        pytest.skip("the widget HTML manager is not installed: run `make browser-deps`")
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed: run `make browser-deps`")
    from ipywidgets.embed import embed_minimal_html
    from playwright.sync_api import sync_playwright

    site = tmp_path / "site"
    site.mkdir()
    for item in DIST.iterdir():  # embed.js and the font files it loads beside it
        (site / item.name).symlink_to(item)
    embed_minimal_html(
        site / "index.html",
        views=[view],
        title="gpu2tpu view",
        requirejs=False,
        embed_url="embed.js",
        cors=False,
    )
    page_html = (site / "index.html").read_text()
    assert "cdn.jsdelivr" not in page_html and "cdnjs" not in page_html
    # Chromium asks for /favicon.ico on its own; an empty inline icon keeps the log clean.
    assert "<head>" in page_html
    page_html = page_html.replace("<head>", '<head><link rel="icon" href="data:,">', 1)
    (site / "index.html").write_text(page_html)

    errors: list[str] = []
    failed: list[str] = []
    with serve(site) as served, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": width, "height": 900},
        )
        try:
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
            page.on(
                "response",
                lambda r: failed.append(f"{r.url} ({r.status})") if r.status >= 400 else None,
            )
            page.goto(served.url + "index.html", wait_until="load")
            page.wait_for_selector(".g2t-view", state="visible", timeout=30_000)
            yield Browser(page, served, errors, failed)
        finally:
            context.close()


@pytest.mark.slow
@pytest.mark.browser
def test_widget_renders_in_headless_chromium(tmp_path, result):
    with opened(result.widget(), tmp_path) as browser:
        page = browser.page
        page.wait_for_selector(".g2t-table tr.g2t-row", state="visible", timeout=30_000)
        page.wait_for_selector("svg.g2t-bars rect.g2t-bar", state="visible", timeout=30_000)

        table = page.locator(".g2t-table:visible").first
        rows = table.locator("tbody tr.g2t-row")
        assert rows.count() == len(result.comparison.rows)
        table_text = table.inner_text()
        for row in result.comparison.rows:
            assert row.device_name in table_text
        assert "measured" in table_text and "estimated" in table_text
        assert "sizing only" in table_text  # the estimates come from a CPU run
        assert "Prices: on-demand" in page.locator(".g2t-prices:visible").inner_text()

        step_bars = page.locator('svg.g2t-bars[data-metric="step_seconds"]:visible rect.g2t-bar')
        assert step_bars.count() == len(result.comparison.rows)
        widths = {
            step_bars.nth(i).get_attribute("data-device"): step_bars.nth(i).bounding_box()["width"]
            for i in range(step_bars.count())
        }
        assert all(w > 0 for w in widths.values())
        # the slowest device (the CPU run) has the longest bar
        assert max(widths, key=widths.get) == "cpu"
        money_bars = page.locator(
            'svg.g2t-bars[data-metric="cost_per_1m_tokens"]:visible rect.g2t-bar'
        )
        priced = [r for r in result.comparison.rows if r.cost_per_1m_tokens is not None]
        assert money_bars.count() == len(priced) > 0

        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACT), full_page=True)

        page.get_by_text("Step times", exact=True).click()
        page.wait_for_selector("svg.g2t-series polyline", state="visible", timeout=10_000)
        assert page.locator("svg.g2t-series rect.g2t-warmup").count() == 1
        page.get_by_text("Details", exact=True).click()
        page.wait_for_selector(".g2t-details-box", state="visible", timeout=10_000)
        details = page.locator(".g2t-details-box:visible").inner_text()
        assert "FLOPs per step" in details and "Prices used" in details
        browser.check_clean()
    assert ARTIFACT.stat().st_size > 10_000
    if os.environ.get("GPU2TPU_UPDATE_README_IMAGE") == "1":  # refresh the README's picture
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACT, README_IMAGE)


def _price_cells(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Device -> its $/hour cell, read from the table the page shows now."""
    table = page.locator(".g2t-table:visible").first
    headers = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    column = headers.index("$/hour")
    out = {}
    for row in table.locator("tbody tr.g2t-row").all():
        cells = row.locator("td").all_inner_texts()
        out[cells[0].replace(" ★", "").strip()] = cells[column].strip()
    return out


@pytest.mark.slow
@pytest.mark.browser
def test_price_toggle_works_in_the_saved_page_without_a_kernel(tmp_path, result):
    view = result.widget()
    spot = result.comparison.repriced("spot")
    want = {r.label: r.price_per_hour for r in spot.rows if r.price_per_hour is not None}
    from gpu2tpu.views.html import money_format

    with opened(view, tmp_path) as browser:
        page = browser.page
        page.wait_for_selector(".g2t-table tr.g2t-row", state="visible", timeout=30_000)
        before = _price_cells(page)
        assert "Prices: on-demand" in page.locator(".g2t-prices:visible").inner_text()
        page.get_by_text("Spot prices", exact=True).click()  # no kernel behind this page
        page.wait_for_function(
            "() => [...document.querySelectorAll('.g2t-prices')]"
            ".some(e => e.offsetParent !== null && e.innerText.includes('Prices: spot'))",
            timeout=10_000,
        )
        after = _price_cells(page)
        assert [d for d in before if before[d] != after[d]], (before, after)
        fmt = money_format([])
        assert {d: after[d] for d in want} == {d: fmt(p) for d, p in want.items()}
        page.get_by_text("Details", exact=True).click()
        details = page.locator(".g2t-details-box:visible").inner_text()
        assert "Prices: spot" in details
        page.screenshot(path=str(ARTIFACTS / "widget-spot.png"), full_page=True)
        browser.check_clean()


@pytest.mark.slow
@pytest.mark.browser
def test_narrow_layout_scrolls_tables_not_the_page(tmp_path, result):
    with opened(result.widget(), tmp_path, width=640) as browser:
        page = browser.page
        page.wait_for_selector(".g2t-table tr.g2t-row", state="visible", timeout=30_000)
        sizes = page.evaluate(
            """() => {
                const box = [...document.querySelectorAll('.g2t-scroll')]
                    .find(e => e.offsetParent !== null);
                box.scrollLeft = box.scrollWidth;
                return {page: document.documentElement.scrollWidth,
                        view: document.documentElement.clientWidth,
                        boxScroll: box.scrollWidth, boxWidth: box.clientWidth,
                        boxLeft: box.scrollLeft,
                        right: box.getBoundingClientRect().right};
            }"""
        )
        assert sizes["view"] <= 640
        assert sizes["page"] <= sizes["view"], sizes  # the page itself does not scroll sideways
        assert sizes["boxScroll"] > sizes["boxWidth"], sizes  # the wide table scrolls inside
        assert sizes["boxLeft"] > 0 and sizes["right"] <= sizes["view"], sizes
        page.screenshot(path=str(ARTIFACTS / "widget-640.png"), full_page=True)
        browser.check_clean()


@pytest.mark.slow
@pytest.mark.browser
def test_forecast_view_renders_in_headless_chromium(tmp_path):
    from test_widgets import make_forecast

    from gpu2tpu.views.widgets import forecast_view

    forecast = make_forecast()
    with opened(forecast_view(forecast), tmp_path) as browser:
        page = browser.page
        page.wait_for_selector(".g2t-targets tr.g2t-target", state="visible", timeout=30_000)
        targets = page.locator(".g2t-targets tr.g2t-target")
        assert targets.count() == len(forecast.targets)
        text = page.locator(".g2t-targets").inner_text()
        assert "of 15.8 GiB" in text and "not searched" in text and "compute" in text
        bars = page.locator(".g2t-targets svg.g2t-memory")
        assert bars.count() == 2 and all(b.bounding_box()["width"] > 0 for b in bars.all())
        tabs = page.locator(".lm-TabBar-tab, .p-TabBar-tab").all_inner_texts()
        assert [t.strip() for t in tabs] == ["Comparison", "Details"]  # no empty series tab
        legend = page.locator(".g2t-note:visible").all_inner_texts()
        assert any("libtpu compiled the step" in n for n in legend)
        assert not any("measured run" in n for n in legend)
        page.screenshot(path=str(ARTIFACTS / "forecast.png"), full_page=True)
        browser.check_clean()
