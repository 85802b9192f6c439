"""run --report FILE.html and log --report, opened in a real headless browser (Debian's
chromium and chromedriver, driven by selenium): each picture renders with the right number
of states, samples and kernels, nothing is fetched from anywhere, and a culprit whose name
holds ``<script>`` and an escape sequence is shown as text. The screenshot README shows is
made here (``ENVBISECT_SCREENSHOT=PATH`` keeps it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_run import manifest

pytestmark = pytest.mark.slow

NAME = "EB_SLOW<script>alert(1)</script>\x1b[2J"
# A real torch training loop: the culprit makes every step's matmuls larger.
TRAIN = """
import os, time, torch
torch.manual_seed(0)
n = 768 if any(k.startswith("EB_SLOW") for k in os.environ) else 64
w = torch.randn(n, n, requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-3)
tokens = 0
start = time.perf_counter()
for step in range(30):
    x = torch.randn(64, n)
    loss = (x @ w @ w.T).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    tokens += 64
print(f"ENVBISECT_RESULT {{\\"tok_per_s\\": {tokens / (time.perf_counter() - start):.1f}}}")
"""


def _browser_or_skip() -> None:
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if os.environ.get("CI_REQUIRE_BROWSER"):
        pytest.fail("chromium and chromedriver are required here (CI installs them)")
    pytest.skip("needs chromium and chromedriver (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,1400"):
        opts.add_argument(arg)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run with --profile over a torch script; its report.html and session."""
    root = tmp_path_factory.mktemp("html")
    (root / "train.py").write_text(TRAIN)
    manifest(root / "good.yaml", env={})
    manifest(root / "bad.yaml", env={NAME: "1", "EB_OTHER": "1"})
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "run", "--good", "good.yaml", "--bad", "bad.yaml",
         "--until", "50%", "--session", "s", "--report", "r.html", "--json", "r.json",
         "--profile", "--", sys.executable, "train.py"],
        capture_output=True, text=True, timeout=600, cwd=root, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return root


def _open(driver: Any, page: Path) -> None:
    driver.get(page.as_uri())


def _count(driver: Any, selector: str) -> int:
    return int(driver.execute_script(f"return document.querySelectorAll('{selector}').length"))


def _rendered(driver: Any, figure: str) -> bool:
    box = driver.execute_script(
        "const s = document.querySelector('#picture-' + arguments[0] + ' svg');"
        "if (!s) return null; const r = s.getBoundingClientRect();"
        "return [r.width, r.height];",
        figure,
    )
    return box is not None and box[0] > 100 and box[1] > 50


def test_the_page_draws_every_state_sample_and_kernel(driver: Any, finished: Path) -> None:
    doc = json.loads((finished / "r.json").read_text())
    _open(driver, finished / "r.html")
    for figure in ("samples", "search", "kernels"):
        assert _rendered(driver, figure), figure
    trials = [t for t in doc["trials"] if t["samples"]]
    assert _count(driver, '#picture-samples g[id^="sample-"]') == sum(
        len(t["samples"]) for t in trials
    )
    assert _count(driver, '#picture-search g[id^="rung-"]') == len(doc["trials"])
    kernels = doc.get("kernels") or {}
    notable = [c for c in kernels.get("changes", []) if c.get("change") != "same"]
    assert notable, doc.get("kernels_note")
    assert _count(driver, '#picture-kernels g[id^="kernel-"]') == min(len(notable), 12)
    # Nothing was fetched: no resource besides the page itself, no script on it.
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert _count(driver, "script") == 0
    # The culprit's name is text: its <script> did not run (an alert would be open) and
    # its escape is shown escaped.
    text = driver.execute_script("return document.body.innerText")
    assert "<script>alert(1)</script>\\x1b[2J" in text
    assert "\x1b" not in text
    shot = os.environ.get("ENVBISECT_SCREENSHOT")
    driver.save_screenshot(shot or str(finished / "report.png"))


def test_log_draws_the_same_session(driver: Any, finished: Path) -> None:
    out = finished / "log.html"
    proc = subprocess.run(
        [sys.executable, "-m", "envbisect", "log", "--session", "s", "--report", str(out)],
        capture_output=True, text=True, timeout=120, cwd=finished, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((finished / "r.json").read_text())
    _open(driver, out)
    assert _rendered(driver, "samples") and _rendered(driver, "search")
    assert _count(driver, '#picture-search g[id^="rung-"]') == len(doc["trials"])
    assert _count(driver, '#picture-samples g[id^="sample-"]') == sum(
        len(t["samples"]) for t in doc["trials"]
    )
    # The session keeps its own report.md with its pictures beside it, and report.html.
    session = finished / "s"
    assert (session / "report.html").is_file()
    md = (session / "report.md").read_text()
    assert "![How sure is it: every sample of every trial](report-samples.svg)" in md
    assert (session / "report-samples.svg").read_text().startswith("<svg")
