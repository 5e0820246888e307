"""The demo page (the front's /demo/, and tritontts-demo's for a front elsewhere) in headless
Chromium, for every family and checkpoint variant on its tiny checkpoint (Piper on its real
voice), on the server the contract suite starts for it (no extra server start):

- the form shows exactly the fields GET /v1/audio/models describes for the model (a
  field the checkpoint refuses is not there: no reference upload for a preset-voice
  checkpoint, no instructions where they are refused);
- Generate, filled in as a user would (the family's example fields, a reference file
  uploaded where it clones, a preset voice where it has them, instructions where it takes
  them; instruction-only models get an empty text), plays the stream from its first chunk:
  the AudioWorklet played every sample the front sent, in order, with nothing between
  chunks (the played samples' count and hash equal the downloaded WAV's, from sample 0 to
  its end), and those samples are the front's own answer to the same request;
- a bad field shows the front's message for it and marks the field, and so does a
  request without a field the model requires.

A screenshot of each generated page is saved (printed path; docs/demo/ keeps some)."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tritontts.families import DEFAULT_FAMILY, FAMILIES
from tritontts.testing.audio import decode, rms
from tritontts.testing.stack import free_port, new_user_environment, wait_healthy

CASES = [(name, None) for name in FAMILIES] + [
    (name, variant) for name, family in FAMILIES.items() for variant in family.variants]
IDS = [name if variant is None else f"{name}-{variant}" for name, variant in CASES]
TEXT = "The quick brown fox jumps over the lazy dog."
INSTRUCTIONS = "female, low pitch"     # a style, a voice description, or attributes: every family's kind
SEED = 7


def stack_for(params):
    """The contract suite's stack for the case (tests/conftest.py groups tests by it)."""
    name, variant = params["case"]
    return (name,), None if variant is None else {name: FAMILIES[name].variants[variant].options}


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request):
    return request.param


@pytest.fixture(scope="module")
def served(case, stacks):
    name, variant = case
    options = None if variant is None else {name: FAMILIES[name].variants[variant].options}
    return stacks.get((name,), options)


@pytest.fixture(scope="module")
def example(case) -> dict:
    family = FAMILIES[case[0]]
    return family.example_params() if case[1] is None else family.variants[case[1]].example_params()


@pytest.fixture(scope="module")
def description(served, case) -> dict:
    models = httpx.get(served.url + "/v1/audio/models", timeout=30).json()["data"]
    return next(m for m in models if m["id"] == case[0])


@pytest.fixture(scope="session")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian chromium and chromium-driver are needed (scripts/setup.sh)"
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", "--window-size=1100,1500",
                 "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"):
        options.add_argument(flag)
    session = webdriver.Chrome(service=Service(driver), options=options)
    session.set_script_timeout(30)
    yield session
    session.quit()


class Page:
    """The demo page in the browser, driven through its elements (ids and data-field)."""

    def __init__(self, browser, url: str, model: str):
        from selenium.webdriver.support.ui import WebDriverWait

        self.b, self.wait = browser, WebDriverWait
        browser.get(f"{url}/demo/?model={model}")
        self.wait(browser, 60).until(lambda b: b.execute_script("return document.body.dataset.ready === 'true'"))
        assert self.js("return document.getElementById('model').value") == model

    def js(self, script: str, *args):
        return self.b.execute_script(script, *args)

    def shown_fields(self) -> list[str]:
        return self.js("return [...document.querySelectorAll('#fields [data-field], #advanced [data-field]')]"
                       ".map(e => e.dataset.field)")

    def set(self, field: str, value) -> None:
        """A field's widget set as a user would (a select's option, typed text)."""
        self.js("const e = document.querySelector(`[data-field='${arguments[0]}']`);"
                "e.value = arguments[1]; e.dispatchEvent(new Event('change'))", field, str(value))

    def upload(self, field: str, path: Path) -> None:
        from selenium.webdriver.common.by import By

        self.b.find_element(By.ID, f"field-{field}-file").send_keys(str(path))
        self.wait(self.b, 30).until(lambda b: self.js(
            "return document.getElementById(arguments[0]).dataset.loaded", f"field-{field}"))

    def generate(self, timeout: float = 300) -> dict:
        from selenium.webdriver.common.by import By

        self.b.find_element(By.ID, "generate").click()
        self.wait(self.b, timeout).until(lambda b: self.js(
            "const l = window.tritonttsDemo.last; return l && (l.drained || l.error) &&"
            " !document.getElementById('generate').disabled"))
        return self.js("return window.tritonttsDemo.last")

    def error(self) -> tuple[str, str, list[str]]:
        """(the error box's text, the field it names, the fields marked invalid)."""
        return self.js("const e = document.getElementById('error');"
                       "return [e.hidden ? '' : e.textContent, e.dataset.param || '',"
                       " [...document.querySelectorAll('.invalid')].map(n => n.dataset.field)]")

    def download(self) -> bytes:
        """The Download link's WAV, as the browser holds it."""
        return base64.b64decode(self.b.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(document.getElementById('download').href).then(r => r.blob()).then(b => {"
            " const f = new FileReader(); f.onload = () => done(f.result.split(',')[1]); f.readAsDataURL(b); })"))


def fnv1a(samples: np.ndarray) -> int:
    """The page's hash of 16-bit samples (FNV-1a over their little-endian bytes)."""
    h = 0x811C9DC5
    for byte in samples.astype("<i2").tobytes():     # int16 samples
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def fill_in(page: Page, description: dict, example: dict, tmp: Path) -> dict:
    """The form filled as a user would for this model; returns the request the page should
    send (what the front is asked directly to compare)."""
    fields = {f["name"]: f for f in description["fields"]}
    body = {"model": description["id"], "input": TEXT, "voice": "default"}
    page.set("input", TEXT)
    if not description["input_required"]:
        page.set("input", "")                 # instruction-only: the instructions carry it
        body["input"] = ""
    presets = [v for v in description["voices"] if v != "default"]
    if presets:
        page.set("voice", presets[-1])
        body["voice"] = presets[-1]
    wanted = dict(example)
    if "instructions" in fields and "instructions" not in wanted:
        wanted["instructions"] = INSTRUCTIONS
    wanted.setdefault("seed", SEED)
    for name, value in wanted.items():
        assert name in fields, f"the example's {name} has no field on the page"
        if fields[name]["kind"] == "audio":
            path = tmp / f"{name}.wav"
            path.write_bytes(base64.b64decode(value))
            page.upload(name, path)
            body[name] = "data:audio/wav;base64," + value
        else:
            page.set(name, value if fields[name]["kind"] != "json" else json.dumps(value))
            body[name] = value
    return body


def test_the_form_shows_exactly_the_fields_the_front_describes(served, browser, description):
    page = Page(browser, served.url, description["id"])
    shown = page.shown_fields()
    assert shown == [f["name"] for f in description["fields"]]
    family = FAMILIES[description["family"]]
    absent = (set(family.fields.takes) | set(family.fields.refuses)) - {f["name"] for f in description["fields"]}
    assert not absent & set(shown)
    presets = page.js("return [...document.getElementById('voice').options].map(o => o.value)")
    assert presets[:len(description["voices"])] == description["voices"]
    required = page.js("return [...document.querySelectorAll('label.field.required')].map(l => l.dataset.for)")
    assert set(required) == {f["name"] for f in description["fields"] if f["required"]}
    text_required = page.js("return document.getElementById('input').closest('label').classList.contains('required')")
    assert text_required == description["input_required"]


def test_generate_plays_every_sample_of_the_front_s_answer_in_order_from_the_first_chunk(
        served, browser, description, example, tmp_path, case):
    page = Page(browser, served.url, description["id"])
    body = fill_in(page, description, example, tmp_path)
    last = page.generate()
    assert last["error"] is None, last
    wav = page.download()
    audio, rate = decode(wav)
    samples = np.frombuffer(wav[44:], "<i2")        # the page's WAV: a 44-byte header, 16-bit PCM
    assert rate == last["rate"] and samples.size == audio.size and samples.size > 0
    # Gapless: the worklet played exactly the received samples, in order, from 0 to the end.
    assert last["received"] == last["played"] == samples.size, last
    assert last["receivedHash"] == last["playedHash"] == fnv1a(samples), last
    assert last["firstAudioMs"] is not None and last["drained"]
    # The page asked for what the form says, and played the front's own answer to it: the
    # same seeded body sent again, alone, replays byte for byte on every family (the
    # seeded-replay contract, tests/contract/test_family_contract.py; docs/api.md). Nothing
    # else runs on this server meanwhile: the page has drained its answer.
    assert last["body"] == {**body, "response_format": "pcm", "stream_format": "audio"}
    assert "seed" in last["body"]
    direct = httpx.post(served.url + "/v1/audio/speech", timeout=300, json=last["body"])
    assert direct.status_code == 200, direct.text
    assert int(direct.headers["X-Sample-Rate"]) == rate
    assert np.array_equal(np.frombuffer(direct.content, "<i2"), samples)
    if description["family"] == DEFAULT_FAMILY:
        assert rms(audio) > 0.02                  # real weights: speech, not noise
    shot = tmp_path / f"demo-{'-'.join(c for c in case if c)}.png"
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot} ({last['received'] / rate:.2f} s at {rate} Hz, first audio after "
          f"{last['firstAudioMs']} ms, {last['underruns']} underruns)")


def test_a_bad_field_shows_the_front_s_message_and_marks_the_field(served, browser, description, example,
                                                                    tmp_path):
    page = Page(browser, served.url, description["id"])
    body = fill_in(page, description, example, tmp_path)
    page.set("seed", -1)
    last = page.generate()
    assert last["body"] == {**body, "seed": -1, "response_format": "pcm", "stream_format": "audio"}
    direct = httpx.post(served.url + "/v1/audio/speech", timeout=60, json=last["body"])
    assert direct.status_code == 400
    message, param, marked = page.error()
    front = direct.json()["error"]
    assert last["error"] == {"status": 400, "message": front["message"], "param": front["param"]}
    assert front["message"] in message and param == front["param"] == "seed" and marked == ["seed"]


def test_a_request_without_a_required_field_shows_the_front_s_message(served, browser, description, example,
                                                                      tmp_path):
    required = [f["name"] for f in description["fields"] if f["required"]]
    if not required:
        pytest.skip("the model requires no field beyond the text")
    page = Page(browser, served.url, description["id"])
    body = fill_in(page, description, example, tmp_path)
    for name in required:
        if any(f["name"] == name and f["kind"] == "audio" for f in description["fields"]):
            page.js(f"document.getElementById('field-{name}-clear').click()")
        else:
            page.set(name, "")
        body.pop(name, None)
    last = page.generate()
    assert last["body"] == {**body, "response_format": "pcm", "stream_format": "audio"}
    direct = httpx.post(served.url + "/v1/audio/speech", timeout=60, json=last["body"])
    assert direct.status_code == 400, direct.text
    message, param, _ = page.error()
    assert last["error"]["status"] == 400 and direct.json()["error"]["message"] in message


@pytest.fixture(scope="module")
def demo_proxy(case, served, tmp_path_factory):
    """tritontts-demo (its console script) in front of the served front; only for the
    default voice (the proxy is one code path), skipped before it starts for the others."""
    if case != (DEFAULT_FAMILY, None):
        pytest.skip("the proxy is one code path: run on the default voice")
    tmp = tmp_path_factory.mktemp("demo")
    port = free_port()
    log = tmp / "demo.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "tritontts-demo"), "--url", served.url,
                             "--port", str(port)], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env=new_user_environment(tmp / "caches"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 60, log.read_text, "tritontts-demo")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_tritontts_demo_serves_the_page_for_a_front_elsewhere_and_it_plays(demo_proxy, browser, description,
                                                                         example, tmp_path):
    page = Page(browser, demo_proxy, description["id"])
    fill_in(page, description, example, tmp_path)
    last = page.generate()
    assert last["error"] is None and last["received"] == last["played"] > 0, last
    assert last["receivedHash"] == last["playedHash"]


def takes_reference(name: str, variant: str | None) -> bool:
    """Whether the case's model shows a reference field (its descriptor's fields, less what
    its checkpoint's form hides; a variant's own form needs its checkpoint, so: the default)."""
    family = FAMILIES[name]
    return variant is None and "ref_audio" in family.fields.takes and "ref_audio" not in family.form(None).hidden


# The recorder is page code, the same for every model: run on the first model that takes a reference.
RECORDED = next(c for c in CASES if takes_reference(*c))


def test_a_reference_recorded_in_the_page_is_a_wav_of_what_the_microphone_gave(served, browser, description,
                                                                              case):
    if case != RECORDED:
        pytest.skip(f"recording is page code, the same for every model: run on {RECORDED[0]}")
    audio_fields = [f["name"] for f in description["fields"] if f["kind"] == "audio"]
    import time

    page = Page(browser, served.url, description["id"])
    name = audio_fields[0]
    page.js(f"document.getElementById('field-{name}-record').click()")
    page.wait(browser, 30).until(lambda b: page.js(
        f"return document.getElementById('field-{name}-record').textContent === 'Stop recording'"))
    time.sleep(1.5)
    page.js(f"document.getElementById('field-{name}-record').click()")
    page.wait(browser, 30).until(lambda b: page.js(
        f"return document.getElementById('field-{name}').dataset.loaded === 'recording'"))
    url = page.js(f"return window.tritonttsDemo.state.values[{name!r}]")
    assert url.startswith("data:audio/wav;base64,")
    audio, rate = decode(base64.b64decode(url.partition(",")[2]))
    # Chromium's fake microphone (a beep each second) for about as long as it was recorded.
    assert 1.0 < audio.size / rate < 4.0 and rms(audio) > 0.001, (audio.size / rate, rms(audio))
