"""The HTML report in a real browser: headless Chromium opens what ``flightrec analyze --html``
wrote, the page's script runs, and the DOM it leaves is checked.

Needs Chromium (Debian: ``chromium``; ``.ci/browser.sh`` installs it); the hover-and-click test
also needs ``chromium-driver`` and the ``selenium`` client. Each test skips, saying what is
missing, where they are not found. The screenshot of the sample's page is kept at
``.cache/test-artifacts/html-report-stalled_rank.png`` for a reader to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".cache" / "test-artifacts"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium found (Debian: apt-get install chromium; .ci/browser.sh does it)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "cli"), env.get("PYTHONPATH", "")])
    return env


def _flightrec(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "flightrec_cli", *args],
        capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    return out


def _chromium(page: Path, profile: Path, *args: str) -> str:
    out = subprocess.run(
        [_browser(), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


class _Dom(HTMLParser):
    """The elements of a dumped DOM as (tag, attributes) and the text inside chosen ids."""

    def __init__(self, ids: tuple[str, ...]) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = dict.fromkeys(ids, "")
        self._open: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        if tag not in ("br", "meta", "rect", "img", "input", "link"):
            self._open.append(a.get("id") if a.get("id") in self.text else None)

    def handle_endtag(self, tag: str) -> None:
        if self._open and tag not in ("br", "meta", "rect", "img", "input", "link"):
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for i in self._open:
            if i is not None:
                self.text[i] += data

    def find(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and cls in a.get("class", "").split()]


def _dom(text: str) -> _Dom:
    dom = _Dom(("verdict", "entry"))
    dom.feed(text)
    return dom


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_the_sample_report_in_chromium(tmp_path: Path) -> None:
    _browser()
    page = tmp_path / "report.html"
    _flightrec("analyze", "samples/stalled_rank", "--html", str(page))
    dom = _dom(_chromium(page, tmp_path / "profile", "--dump-dom"))
    body = next(a for t, a in dom.elements if t == "body")
    assert body["data-ready"] == "1", "the page's script did not finish"
    print(f"page script ran in {body['data-render-ms']} ms")
    assert "Rank 2 (vm, pid 12474, cpu) never entered all_reduce #4" in dom.text["verdict"]
    # One grid per group, drawn by the script; rank 2's rows marked as the culprit's.
    grids = dom.find("svg", "grid")
    assert [g["data-group"] for g in grids] == ["0", "1", "2"]
    culprit = dom.find("g", "culprit")
    assert [g["data-ranks"] for g in culprit] == ["rank 2", "rank 2"]
    assert len(dom.find("rect", "cell")) == 4 * 4 + 2 * 4 + 2 * 4
    assert len(dom.find("rect", "s2")) == 1  # the one collective never entered: rank 2's #4
    assert len(dom.find("rect", "mark")) == 2
    # The entry pane opens on the culprit's cell at the finding's collective, with the call
    # its peers wait in there.
    assert "rank 2: never entered" in dom.text["entry"]
    assert "Rank 0 at this seq:all_reduce #4 (enqueued)" in dom.text["entry"]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "html-report-stalled_rank.png"
    shot.unlink(missing_ok=True)
    _chromium(page, tmp_path / "profile2", "--window-size=1280,1100", f"--screenshot={shot}")
    assert _png_size(shot) == (1280, 1100)
    print(f"screenshot: {shot}")


def test_a_simulated_large_job_draws_few_rows(tmp_path: Path) -> None:
    _browser()
    dumps, page = tmp_path / "dumps", tmp_path / "report.html"
    _flightrec(
        "simulate", "--out", str(dumps), "--ranks", "512", "--entries", "64", "--layout", "tp=8,pp=2",
        "--fault", "stall", "--fault-rank", "77", "--processes", "1",
    )  # fmt: skip
    _flightrec("analyze", str(dumps), "--html", str(page))
    dom = _dom(_chromium(page, tmp_path / "profile", "--dump-dom"))
    body = next(a for t, a in dom.elements if t == "body")
    assert body["data-ready"] == "1"
    print(f"{page.stat().st_size:,} bytes; page script ran in {body['data-render-ms']} ms")
    culprit = dom.find("g", "culprit")
    assert culprit and all(g["data-ranks"] == "rank 77" for g in culprit)
    # Every group drawn, and alike ranks share rows: a grid stays a few rows at any scale.
    rows = dom.find("g", "row")
    assert len(dom.find("svg", "grid")) >= 2 and len(rows) < 200
    merged = [g for g in rows if re.match(r"ranks .* \(\d+\)$", g["data-ranks"])]
    assert merged, "no row of alike ranks"


def test_hovering_and_clicking_a_cell_show_its_entry(tmp_path: Path) -> None:
    browser = _browser()
    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        pytest.skip("no chromedriver found (Debian: apt-get install chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="the selenium client is needed")
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    page = tmp_path / "report.html"
    _flightrec("analyze", "samples/stalled_rank", "--html", str(page))
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver_path))
    try:
        driver.get(page.as_uri())
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"
        # Rank 0's cell at seq 4 in group 0: the all_reduce it waits in.
        cell = driver.find_element(
            By.CSS_SELECTOR, 'svg[data-group="0"] g.row[data-ranks="rank 0"] rect[data-col="3"]'
        )
        ActionChains(driver).move_to_element(cell).perform()
        tip = driver.find_element(By.ID, "tip")
        assert tip.is_displayed()
        assert "rank 0: pending" in tip.text and "all_reduce #4 (enqueued)" in tip.text
        assert "float32[" in tip.text and "train_job.py:88" in tip.text
        cell.click()
        pane = driver.find_element(By.ID, "entry").text
        assert "rank 0: pending" in pane and "before the dump" in pane
        assert "sel" in (cell.get_attribute("class") or "").split()
    finally:
        driver.quit()
