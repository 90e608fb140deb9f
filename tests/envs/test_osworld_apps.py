"""OSWorld's apps (GIMP, LibreOffice Impress, Thunderbird, VLC) start and draw on real 1920x1080 desktops, OSWorld's
screen size: the xvfb provider's (the host's packages, RETRACE_OSWORLD_APPS=1 scripts/bootstrap) and the docker
provider's `osworld` image variant (envs/docker/desktop-image/packages-osworld.txt).

Each test launches the app in a task (a reset, then `launch` as a case's setup step does), waits for its main
window (not its splash), checks that the X server and the screenshot are 1920x1080 and that the window shows what
the app drew, and prints the time to that window. GIMP and VLC must then show the same pixels in the
container as on the xvfb desktop, which a missing package (an image loader, a font) breaks. An app that is not
installed on the host is skipped, with the command that installs it; the docker tests skip without an engine,
except under CI (RETRACE_REQUIRE_DOCKER=1). Two tests without a desktop check how the variant is chosen and tagged.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pytest_retrace.envs import Environment
from pytest_retrace.envs.config import load_env_config
from pytest_retrace.envs.docker import image
from pytest_retrace.envs.docker.environment import DockerEnvironment
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import Task
from tests.helpers import docker_client

OSWORLD_SCREEN = (1920, 1080)
LAUNCH_TIMEOUT = 180.0  # generous: a first start on a loaded 2-core machine, not a measure of speed
MIN_COLOURS = 64  # a window the app drew has text, icons and edges; an undrawn one is one or two colours
QUIET = 3.0  # seconds a first start's screen stays unchanged before it counts as its last


@dataclass(frozen=True)
class App:
    command: list[str]
    window: str  # the main window's title (a regex); splash screens are named otherwise


APPS = {
    "gimp": App(["gimp"], "GNU Image Manipulation Program"),  # its splash: "GIMP Startup"
    "impress": App(["libreoffice", "--impress"], "LibreOffice Impress"),  # its splash: "LibreOffice 7.4"
    "thunderbird": App(["thunderbird"], "Mozilla Thunderbird"),
    "vlc": App(["vlc"], "VLC media player"),  # with its first-run privacy dialog beside it
}

_TRUE = {"func": "exact_match", "result": {"type": "rule", "rules": 1}, "expected": {"type": "rule", "rules": 1}}
EMPTY = Task.model_validate({"id": "osworld-app", "instruction": "x", "domain": "test", "setup": [],
                             "evaluator": _TRUE})


def _colours(pixels: np.ndarray) -> int:
    packed = (pixels[..., 0].astype(np.uint32) << 16) | (pixels[..., 1].astype(np.uint32) << 8) | pixels[..., 2]
    return len(np.unique(packed))


def _window_rect(env: Environment, window: str) -> tuple[int, int, int, int] | None:
    """(x, y, width, height) of the first visible window titled `window`, asked of the task's own X server; None
    while there is none (a window found can be gone when its geometry is asked: BadWindow, mid-start)."""
    res = env.run(f"xdotool search --onlyvisible --name '{window}' getwindowgeometry --shell %1")
    geometry = dict(line.split("=", 1) for line in res.stdout.split() if "=" in line)
    if res.returncode != 0 or not {"X", "Y", "WIDTH", "HEIGHT"} <= geometry.keys():
        return None
    return int(geometry["X"]), int(geometry["Y"]), int(geometry["WIDTH"]), int(geometry["HEIGHT"])


def _drawn(env: Environment, name: str, deadline: float) -> tuple[int, tuple[int, int, int, int]]:
    """Colours in the main window and its rectangle, once the app has drawn it, waiting up to `deadline`: a mapped
    window is not yet a drawn one (Impress's showed one colour when the screen first settled after it mapped)."""
    while True:
        rect = _window_rect(env, APPS[name].window)
        shot = env.screenshot()
        assert shot.shape == (1080, 1920, 3), shot.shape
        if rect is not None:
            x, y, w, h = rect
            colours = _colours(shot[max(y, 0):min(y + h, 1080), max(x, 0):min(x + w, 1920)])
            if colours >= MIN_COLOURS or time.monotonic() > deadline:
                return colours, rect
        assert time.monotonic() < deadline, f"{name}'s window {APPS[name].window!r} went away"
        time.sleep(0.2)


def check_app_draws(env: Environment, provider: str, name: str) -> tuple[float, float]:
    """Launch `name` in a fresh task on `env`: the seconds until its main window showed, and until it was drawn."""
    app = APPS[name]
    env.reset(EMPTY, Path("."))
    start = time.monotonic()
    env.launch(app.command, window=app.window, timeout=LAUNCH_TIMEOUT)
    mapped = time.monotonic() - start
    dimensions = env.run("xdpyinfo | grep dimensions").stdout
    assert "1920x1080 pixels" in dimensions, dimensions
    colours, (x, y, w, h) = _drawn(env, name, time.monotonic() + LAUNCH_TIMEOUT)
    drawn = time.monotonic() - start
    assert w >= 400 and h >= 300, f"{name}'s window is {w}x{h}"
    assert colours >= MIN_COLOURS, f"{name}'s {w}x{h} window at {x},{y} shows {colours} colour(s): never drawn"
    print(f"osworld app on {provider} at 1920x1080: {name:<12} main window after {mapped:5.1f} s, drawn after "
          f"{drawn:5.1f} s, {colours} colours in its {w}x{h} window")
    return mapped, drawn


def _still_screen(env: Environment, deadline: float) -> np.ndarray:
    """The screen once it stayed unchanged for QUIET seconds (a first start ends in a still screen)."""
    shot, since = env.screenshot(), time.monotonic()
    while time.monotonic() - since < QUIET:
        assert time.monotonic() < deadline, f"the screen was still changing after {LAUNCH_TIMEOUT:g} s"
        time.sleep(0.1)
        now = env.screenshot()
        if not np.array_equal(now, shot):
            shot, since = now, time.monotonic()
    return shot


# -- the variant's recipe (no engine needed) -------------------------------------------------------------
def test_the_osworld_variant_is_chosen_by_an_option_and_checked_before_anything_starts() -> None:
    env = load_env_config("docker", overrides=["variant=osworld"]).create(size=OSWORLD_SCREEN)
    assert env.variant == "osworld" and env.size == OSWORLD_SCREEN
    assert DockerEnvironment().variant == "default"
    with pytest.raises(ValueError, match="variant: 'osword' is not one of default, osworld"):
        DockerEnvironment(variant="osword")
    with pytest.raises(ValueError, match="give one of the two"):
        DockerEnvironment(variant="osworld", image="my-desktop:1")


def test_the_osworld_variant_has_tags_of_its_own_and_leaves_the_default_alone(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    default, osworld = image.base_tag(), image.base_tag("osworld")
    assert default.startswith("pytest-retrace-base:") and osworld.startswith("pytest-retrace-base-osworld:")
    assert image.desktop_tag("osworld").startswith("pytest-retrace-desktop-osworld:")
    assert image.desktop_tag() != image.desktop_tag("osworld")
    # the variant's list is an input of its own tag only: editing it never rebuilds the default image
    recipe = tmp_path / "desktop-image"
    shutil.copytree(image.RECIPE, recipe)
    with (recipe / "packages-osworld.txt").open("a") as f:
        f.write("inkscape\n")
    monkeypatch.setattr(image, "RECIPE", recipe)
    assert image.base_tag() == default and image.base_tag("osworld") != osworld
    apps = (recipe / "packages-osworld.txt").read_text()
    assert all(name in apps.split() for name in ("gimp", "libreoffice-impress", "thunderbird", "vlc", "socat"))


# -- the xvfb provider, with the host's packages -----------------------------------------------------------
def _installed(name: str) -> None:
    program = APPS[name].command[0]
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed: RETRACE_OSWORLD_APPS=1 scripts/bootstrap installs OSWorld's apps")


@pytest.fixture(scope="module")
def desktop() -> Iterator[XvfbEnvironment]:
    env = XvfbEnvironment(size=OSWORLD_SCREEN)
    env.start()
    yield env
    env.close()


@pytest.mark.desktop
@pytest.mark.parametrize("name", list(APPS))
def test_osworld_app_draws_on_a_1920x1080_xvfb_desktop(desktop: XvfbEnvironment, name: str) -> None:
    _installed(name)
    check_app_draws(desktop, "xvfb", name)


@pytest.mark.desktop
def test_the_desktop_is_the_size_it_was_given(desktop: XvfbEnvironment) -> None:
    # the check above must be able to fail: a desktop of the default size is not taken for OSWorld's
    small = XvfbEnvironment()
    small.start()
    try:
        small.reset(EMPTY, Path("."))
        assert "1280x800 pixels" in small.run("xdpyinfo | grep dimensions").stdout
        assert small.screenshot().shape == (800, 1280, 3)
    finally:
        small.close()
    desktop.reset(EMPTY, Path("."))
    assert _colours(desktop.screenshot()) < MIN_COLOURS  # an empty desktop does not pass for a drawn window


# -- the docker provider, with the osworld image variant --------------------------------------------------
@pytest.fixture(scope="module")
def container() -> Iterator[Environment]:
    if docker_client() is None:
        pytest.skip("no docker engine answers (under CI, RETRACE_REQUIRE_DOCKER=1 makes this a failure)")
    env = DockerEnvironment(size=OSWORLD_SCREEN, variant="osworld")  # builds the variant on first use
    env.start()
    yield env
    env.close()


@pytest.mark.desktop
@pytest.mark.parametrize("name", list(APPS))
def test_osworld_app_draws_in_the_osworld_docker_image(container: Environment, name: str) -> None:
    check_app_draws(container, "docker", name)


# Left out: Thunderbird's first start opens thunderbird.net in a tab, so its screen depends on the network (in
# the xvfb desktop's network namespace the lookup fails at once, "Server Not Found"; on docker's internal network
# it hangs, "Loading..."); and Impress's sidebar highlights the selected layout or not (a race in its own start:
# 3 of 10 comparisons differed there by 291 pixels, and two starts on xvfb differed from each other the same way).
# Impress's packages are Calc's and Writer's, whose cases the default image already reproduces.
SAME_PIXELS = ("gimp", "vlc")


@pytest.mark.desktop
@pytest.mark.parametrize("name", SAME_PIXELS)
def test_osworld_app_shows_the_same_pixels_in_the_docker_image_as_on_xvfb(container: Environment,
                                                                         desktop: XvfbEnvironment, name: str) -> None:
    # the image's packages are the host's: a missing loader or font (GIMP's SVG icons, DejaVu's italics) shows here
    _installed(name)
    screens = []
    for env in (desktop, container):
        env.reset(EMPTY, Path("."))
        env.launch(APPS[name].command, window=APPS[name].window, timeout=LAUNCH_TIMEOUT)
        _drawn(env, name, time.monotonic() + LAUNCH_TIMEOUT)
        screens.append(_still_screen(env, time.monotonic() + LAUNCH_TIMEOUT))
    differ = np.any(screens[0] != screens[1], axis=2)
    ys, xs = np.nonzero(differ)
    assert not differ.any(), (f"{name}: {int(differ.sum())} pixels differ between xvfb and docker, in "
                              f"x {xs.min()}-{xs.max()}, y {ys.min()}-{ys.max()}")


# OSWorld's VLC getters read the player's state from VLC's Lua HTTP interface (get_vlc_playing_info:
# /requests/status.xml with the password "password"): in vlc-plugin-base, which the image must have too.
VLC_HTTP = ["vlc", "--extraintf", "http", "--http-host", "127.0.0.1", "--http-port", "8080", "--http-password",
            "password"]
STATUS = """python3 -c "import base64, time, urllib.request as u
req = u.Request('http://127.0.0.1:8080/requests/status.xml',
                headers={'Authorization': 'Basic ' + base64.b64encode(b':password').decode()})
for _ in range(150):
    try:
        print(u.urlopen(req, timeout=2).read().decode()); break
    except OSError as exc:
        error = exc; time.sleep(0.2)
else:
    raise SystemExit(repr(error))"
"""


@pytest.mark.desktop
@pytest.mark.parametrize("provider", ["desktop", "container"])
def test_vlc_serves_the_http_interface_osworld_reads_its_state_from(request: pytest.FixtureRequest,
                                                                     provider: str) -> None:
    _installed("vlc")
    env: Environment = request.getfixturevalue(provider)
    env.reset(EMPTY, Path("."))
    env.launch(VLC_HTTP, window=APPS["vlc"].window, timeout=LAUNCH_TIMEOUT)
    res = env.run(STATUS, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "<state>stopped</state>" in res.stdout and "<volume>" in res.stdout, res.stdout[:500]
