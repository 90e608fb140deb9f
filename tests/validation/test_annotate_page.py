"""The annotation page in a real browser (Debian's chromium, headless, driven by chromium-driver through
selenium), against a real `retrace annotate` process: load, answer by keyboard, reload and resume, two
annotators at once, a server killed and restarted mid-way, screenshots of the page checked."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from pytest_retrace.validation.files import Annotation, annotations_file
from tests.validation.annotating import ORACLE_KEYS, Server, small_run, wait_for, write_plan

pytestmark = pytest.mark.desktop  # the samples come from a real run on the desktop

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # Debian's (scripts/bootstrap)
WINDOW = (1400, 1000)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_run(tmp_path_factory.getbasetemp())


@pytest.fixture
def browser():
    """A factory of headless chromium sessions, all quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    drivers = []

    def open_one():
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--window-size={WINDOW[0]},{WINDOW[1]}"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        drivers.append(driver)
        return driver

    yield open_one
    for driver in drivers:
        driver.quit()


def shown_id(driver) -> str | None:
    """The sample on the page once its three images have loaded, else None."""
    return driver.execute_script("""
        const s = document.getElementById('sample');
        if (s.hidden || !s.dataset.id) return null;
        const imgs = [...document.querySelectorAll('#screens img')];
        return imgs.every(i => i.complete && i.naturalWidth > 0) ? s.dataset.id : null;""")


def wait_sample(driver, expected: str) -> None:
    wait_for(lambda: shown_id(driver) == expected, what=f"sample {expected} on the page (showing {shown_id(driver)})")


def keys(driver, text: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(text).perform()


def answer(driver, recovered: str, env: str, expected_next: str | None) -> None:
    from selenium.webdriver.common.keys import Keys

    keys(driver, recovered + env + Keys.ENTER)
    if expected_next is None:
        wait_for(lambda: driver.find_element("id", "done").is_displayed(), what="the 'all done' message")
    else:
        wait_sample(driver, expected_next)


def lines(study: Path, who: str) -> list[Annotation]:
    path = annotations_file(study, who)
    return [Annotation.model_validate_json(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_keyboard_answers_reload_resume_and_screenshots(tmp_path: Path, run: Path, browser) -> None:
    samples = write_plan(tmp_path, run, {"alice": slice(0, 4), "bob": slice(4, 8)})
    server = Server.start(tmp_path, "--port", "0")
    try:
        driver = browser()
        driver.get(server.url)  # no name given: the page asks for one
        wait_for(lambda: driver.find_elements("css selector", "#annotators a"), what="the annotators' links")
        assert [a.text for a in driver.find_elements("css selector", "#annotators a")] == ["alice", "bob"]
        driver.find_element("link text", "alice").click()
        wait_sample(driver, samples[0].id)
        assert driver.find_element("id", "instruction").text == samples[0].instruction
        assert driver.find_element("id", "progress").text == "0 / 4 answered"
        assert driver.find_element("id", "guideline").get_attribute("open")  # shown before the first answer
        assert "environmental noise" in driver.find_element("id", "guideline-text").text
        words = [c.text for c in driver.find_elements("css selector", "#recovery td.words")]
        assert words == [s.rationale or "" for s in samples[0].recovery]
        sizes = driver.execute_script(
            "return [...document.querySelectorAll('#screens img')].map(i => [i.id, i.naturalWidth, i.naturalHeight])")
        assert sizes == [[f"img-{n}", 1280, 800] for n in ("target", "error", "recovered")]
        shot = Image.open(io.BytesIO(driver.get_screenshot_as_png()))
        assert list(shot.size) == driver.execute_script("return [window.innerWidth, window.innerHeight]")
        assert len(shot.convert("RGB").getcolors(1 << 20) or []) > 50  # a rendered page, not a blank one
        assert not any(f'"{k}"' in driver.page_source for k in ORACLE_KEYS)

        keys(driver, "g")  # the guideline closes, and the image views switch
        assert not driver.find_element("id", "guideline").get_attribute("open")
        img = driver.find_element("id", "img-recovered")
        for key, mode in (("d", "diff"), ("d", "recovered"), ("h", "heatmap")):
            keys(driver, key)
            wait_for(lambda m=mode: img.get_attribute("data-mode") == m and img.get_attribute("src").endswith(m)
                     and driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img),
                     what=f"the {mode} view")
        keys(driver, "z")
        assert "zoomed" in driver.find_element("tag name", "body").get_attribute("class")
        assert driver.execute_script("return document.getElementById('img-target').clientWidth") == 1280
        keys(driver, "z?")
        assert driver.find_element("id", "help").is_displayed()
        keys(driver, "\ue00c")  # Escape (Keys.ESCAPE)
        assert not driver.find_element("id", "help").is_displayed()

        from selenium.webdriver.common.keys import Keys

        keys(driver, "y" + Keys.ENTER)  # one question left unanswered: nothing is sent
        assert "answer both questions" in driver.find_element("id", "status").text
        assert lines(tmp_path, "alice") == []
        keys(driver, "e" + Keys.ENTER)
        wait_sample(driver, samples[1].id)
        answer(driver, "n", "v", samples[2].id)
        got = lines(tmp_path, "alice")
        assert [(a.sample, a.recovered, a.environmental_only) for a in got] == [
            (samples[0].id, True, True), (samples[1].id, False, False)]

        driver.refresh()  # resumes at the first unanswered sample
        wait_sample(driver, samples[2].id)
        assert driver.find_element("id", "progress").text == "2 / 4 answered"
        assert not driver.find_element("id", "guideline").get_attribute("open")
        driver.find_element("id", "note").send_keys("a pop-up, nothing else")
        keys(driver, Keys.ESCAPE)  # out of the note: keys are shortcuts again
        answer(driver, "y", "s", samples[3].id)
        answer(driver, "n", "e", None)
        assert [(a.recovered, a.environmental_only, a.note) for a in lines(tmp_path, "alice")[2:]] == [
            (True, None, "a pop-up, nothing else"), (False, True, "")]
        assert driver.find_element("id", "progress").text == "4 / 4 answered"
        assert lines(tmp_path, "bob") == []
    finally:
        server.stop()


def test_two_annotators_at_once(tmp_path: Path, run: Path, browser) -> None:
    samples = write_plan(tmp_path, run, {"alice": slice(0, 6), "bob": slice(2, 8)})
    server = Server.start(tmp_path, "--port", "0")
    try:
        alice, bob = browser(), browser()
        alice.get(server.url + "?annotator=alice")
        bob.get(server.url + "?annotator=bob")
        wait_sample(alice, samples[0].id)
        wait_sample(bob, samples[2].id)
        for i in range(3):  # turn by turn: each page keeps its own place
            answer(alice, "y", "s", samples[i + 1].id)
            answer(bob, "n", "v", samples[i + 3].id)
        assert [a.sample for a in lines(tmp_path, "alice")] == [s.id for s in samples[0:3]]
        assert [a.sample for a in lines(tmp_path, "bob")] == [s.id for s in samples[2:5]]
        assert {(a.annotator, a.recovered) for a in lines(tmp_path, "alice")} == {("alice", True)}
        assert {(a.annotator, a.recovered) for a in lines(tmp_path, "bob")} == {("bob", False)}
    finally:
        server.stop()


def test_killed_server_restarted_mid_way_loses_nothing(tmp_path: Path, run: Path, browser) -> None:
    samples = write_plan(tmp_path, run, {"alice": slice(0, 8)})
    server = Server.start(tmp_path, "--port", "0")
    port = server.port
    driver = browser()
    driver.get(server.url + "?annotator=alice")
    wait_sample(driver, samples[0].id)
    answer(driver, "y", "e", samples[1].id)
    answer(driver, "n", "v", samples[2].id)
    server.kill()  # SIGKILL: no shutdown of any kind
    from selenium.webdriver.common.keys import Keys

    keys(driver, "ys" + Keys.ENTER)  # answered while the server is gone: not saved, and the page says so
    wait_for(lambda: "not saved" in driver.find_element("id", "status").text, what="the 'not saved' message")
    assert [a.sample for a in lines(tmp_path, "alice")] == [samples[0].id, samples[1].id]
    again = Server.start(tmp_path, "--port", port)
    try:
        assert "2 answers so far" in again.banner
        driver.refresh()
        wait_sample(driver, samples[2].id)
        assert driver.find_element("id", "progress").text == "2 / 8 answered"
        answer(driver, "y", "s", samples[3].id)
        assert [(a.sample, a.recovered, a.environmental_only) for a in lines(tmp_path, "alice")] == [
            (samples[0].id, True, True), (samples[1].id, False, False), (samples[2].id, True, None)]
    finally:
        again.stop()
