"""The profiler's widget, exported and opened in a real headless Chromium.

The view is exported with `ipywidgets.embed.embed_minimal_html`, the widget HTML manager
(`@jupyter-widgets/html-manager` from npm, pinned in tests/browser/package.json) is served
from 127.0.0.1 with the page, and Debian's Chromium, driven by Playwright, must render the
table and the bars with no console error and no failed request (jupyter.md §3). The
screenshot is kept in tests/artifacts/widget.png and copied to docs/img/ for the README.
`make browser-deps` installs what this needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BROWSER_DIR = ROOT / "tests" / "browser"
DIST = BROWSER_DIR / "node_modules" / "@jupyter-widgets" / "html-manager" / "dist"
ARTIFACT = ROOT / "tests" / "artifacts" / "widget.png"
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
    from gpu2tpu.profile import profile

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


@pytest.mark.slow
@pytest.mark.browser
def test_widget_renders_in_headless_chromium(tmp_path, result):
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
    view = result.widget()
    embed_minimal_html(
        site / "index.html",
        views=[view],
        title="gpu2tpu profile",
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
            viewport={"width": 1360, "height": 900},
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
            page.wait_for_selector(".g2t-table tr.g2t-row", state="visible", timeout=30_000)
            page.wait_for_selector("svg.g2t-bars rect.g2t-bar", state="visible", timeout=30_000)

            rows = page.locator(".g2t-table tbody tr.g2t-row")
            assert rows.count() == len(result.comparison.rows)
            table_text = page.locator(".g2t-table").inner_text()
            for row in result.comparison.rows:
                assert row.device_name in table_text
            assert "measured" in table_text and "estimated" in table_text
            assert "Prices: on-demand" in page.locator(".g2t-prices").inner_text()

            step_bars = page.locator('svg.g2t-bars[data-metric="step_seconds"] rect.g2t-bar')
            assert step_bars.count() == len(result.comparison.rows)
            widths = {
                step_bars.nth(i).get_attribute("data-device"): step_bars.nth(i).bounding_box()[
                    "width"
                ]
                for i in range(step_bars.count())
            }
            assert all(w > 0 for w in widths.values())
            # the slowest device (the CPU run) has the longest bar
            assert max(widths, key=widths.get) == "cpu"
            money_bars = page.locator('svg.g2t-bars[data-metric="cost_per_1m_tokens"] rect.g2t-bar')
            priced = [r for r in result.comparison.rows if r.cost_per_1m_tokens is not None]
            assert money_bars.count() == len(priced) > 0

            ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACT), full_page=True)

            page.get_by_text("Step times", exact=True).click()
            page.wait_for_selector("svg.g2t-series polyline", state="visible", timeout=10_000)
            assert page.locator("svg.g2t-series rect.g2t-warmup").count() == 1
            page.get_by_text("Details", exact=True).click()
            page.wait_for_selector(".g2t-details-box", state="visible", timeout=10_000)
            details = page.locator(".g2t-details-box").inner_text()
            assert "FLOPs per step" in details and "Prices used" in details
        finally:
            context.close()

    missing = [f"{path} ({status})" for path, status in served.requests if status >= 400]
    assert failed == [] and missing == [], f"failed requests: {failed + missing}"
    assert errors == [], f"console errors: {errors}"
    assert ARTIFACT.stat().st_size > 10_000
    if os.environ.get("GPU2TPU_UPDATE_README_IMAGE") == "1":  # refresh the README's picture
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ARTIFACT, README_IMAGE)
