"""A real headless Chromium (Debian's chromium + chromium-driver, `make
setup-browser`) driven by Selenium, for the viewer's tests, its benchmark and
the docs screenshot.

The Service names /usr/bin/chromedriver so Selenium Manager never tries to
download a driver, and the flags keep Chromium off the network it does not
have (it otherwise stalls on updates, sync and QUIC probes); a fresh profile
folder per browser keeps runs independent.
"""
from __future__ import annotations

import importlib.util
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def missing() -> str | None:
    """Why no browser can run here (None when one can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing: `make setup-browser` installs Debian's chromium and chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return "the selenium package is missing: `make setup` installs requirements.txt"
    return None


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator["object"]:
    """A selenium WebDriver of headless Chromium; quits and removes its profile on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="agent-r-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path: str | Path, timeout: float = 60.0) -> int:
    """Load a viewer page and wait until its script says it is ready; returns
    the page's own load time in ms (navigation start to ready)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(Path(path).resolve().as_uri())
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body && document.body.dataset.ready === 'true'"))
    return int(driver.execute_script("return Number(document.body.dataset.readyMs)"))
