"""The Gradio demo (tritontts-demo, installed as a console script) in headless Chromium
against the real front: the page lists the served model and its voices, Generate streams
audio into a player that plays it as one gapless buffer as long as the whole text, and the
download is a WAV of the whole text. A screenshot of
the finished page is saved (printed path)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tritontts.testing.audio import decode, rms
from tritontts.testing.stack import free_port, new_user_environment

STACK_FAMILIES = ("piper",)
TEXT = "The quick brown fox jumps over the lazy dog. It was a bright and sunny morning."


@pytest.fixture(scope="module")
def demo(stack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    port = free_port()
    log = open(tmp / "demo.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "tritontts-demo"), "--url", stack.url,
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env=new_user_environment(tmp / "caches"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp / "demo.log").read_text()
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url, tmp
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian chromium and chromium-driver are needed (scripts/setup.sh)"
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", "--window-size=1200,1400"):
        options.add_argument(flag)
    session = webdriver.Chrome(service=Service(driver), options=options)
    yield session
    session.quit()


def test_generate_plays_the_stream_gaplessly_and_offers_the_whole_wav(demo, browser, stack):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, tmp = demo
    browser.get(url)
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.ID, "generate"))
    page = browser.page_source
    assert "piper" in page and "default" in page          # from /v1/models and the voices
    box = browser.find_element(By.CSS_SELECTOR, "#text textarea")
    box.clear()
    box.send_keys(TEXT)
    browser.find_element(By.ID, "generate").click()
    WebDriverWait(browser, 180).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#download a"))
    link = browser.find_element(By.CSS_SELECTOR, "#download a").get_attribute("href")
    audio, rate = decode(httpx.get(link, timeout=30).content)
    seconds = audio.size / rate
    assert rate == 22050 and seconds > 2.5 and rms(audio) > 0.02

    def player():
        return browser.execute_script(
            "const a = document.querySelector('#player audio');"
            "return a && {src: a.src, error: a.error, time: a.currentTime, ended: a.ended,"
            " buffered: Array.from({length: a.buffered.length},"
            "                      (_, i) => [a.buffered.start(i), a.buffered.end(i)])};")

    # The page plays it: currentTime moves, and the streamed pieces form one buffered
    # range from 0 to the whole audio's length (gapless: no hole between pieces).
    WebDriverWait(browser, 60).until(lambda b: (p := player()) and p["buffered"]
                                     and p["buffered"][-1][1] >= seconds - 0.3 and p["time"] > 0.5)
    state = player()
    assert state["src"] and state["error"] is None, state
    assert len(state["buffered"]) == 1 and state["buffered"][0][0] == 0, state
    assert abs(state["buffered"][0][1] - seconds) < 0.3, (state, seconds)
    shot = tmp / "demo.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
