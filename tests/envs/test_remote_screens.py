"""The remote provider on an OSWorld-sized guest (`retrace guest` on a 1920x1080 Xvfb display): a case that
declares that screen runs there, one that does not is refused with the fix named, and the screenshots one case
takes, polled as today and with the budget's backoff (what an OSWorld VM, whose /screenshot leaks an X
connection per call, gets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from PIL import Image

from pytest_retrace.actions import parse_action
from pytest_retrace.agents.baselines import NoopAgent, OracleAgent
from pytest_retrace.envs import EnvError
from pytest_retrace.envs.remote.environment import RemoteEnvironment
from pytest_retrace.replay.cases import Task, load_case
from pytest_retrace.replay.result import ReplayOptions
from pytest_retrace.replay.run import run_case
from tests.guests import Display, Guest, needs_desktop

OSWORLD = (1920, 1080)  # OSWorld's VMs
TERM = {"type": "launch", "command": ["xterm", "-title", "osworld-size", "-fa", "DejaVu Sans Mono", "-fs", "11",
                                      "-bg", "white", "-fg", "black", "-e", "bash", "--norc", "--noprofile"],
        "window": "osworld-size"}
TASK = {"id": "big-screen", "instruction": "Create ~/out/x.txt containing 'x'.", "domain": "files", "setup": [TERM],
        "evaluator": {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/out/x.txt"},
                      "expected": {"type": "rule", "rules": {"text": "x\n"}}}}
GT = ["pyautogui.write('mkdir -p ~/out && cd ~/out && clear\\n')", "pyautogui.write('echo x > x.txt\\n')"]
PERTURBATION = ["pyautogui.write('zz')"]  # stray keys on the prompt: the next gt command fails
RESET = "for w in $(xdotool search --class xterm); do xdotool windowkill $w 2>/dev/null; done; rm -rf ~/out; true"


@pytest.fixture(scope="module")
def big_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    display = Display(OSWORLD, wm=True)
    guest = None
    try:
        guest = Guest(display, tmp_path_factory.mktemp("big-guest") / "home").start()
        yield guest
    finally:
        for thing in (guest, display):
            if thing is not None:
                thing.close()


def _env(guest: Guest, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int] = OSWORLD,
         **options: object) -> RemoteEnvironment:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    env = RemoteEnvironment(size=size, urls=guest.url, reset=RESET, **options)  # type: ignore[arg-type]
    env.start()
    return env


def _write_case(env: RemoteEnvironment, root: Path, screen: list[int]) -> Path:
    """A case recorded on this guest: its target after gt[0], its error after the stray keys."""
    env.reset(Task.model_validate(TASK), root)
    env.execute(parse_action(GT[0])[0])
    target = env.screenshot()
    for text in PERTURBATION:
        env.execute(parse_action(text)[0])
    error = env.screenshot()
    for name, shot in (("target", target), ("error", error)):
        Image.fromarray(shot).save(root / f"{name}.png")
    doc = {"id": "big-screen-stray-keys", "task": TASK, "trajectory": GT, "t_seed": 1, "perturbation": PERTURBATION,
           "d": 1, "screenshots": {"target": "target.png", "error": "error.png"}, "screen": screen}
    path = root / "case.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.desktop
@needs_desktop
def test_a_case_declaring_the_guests_screen_runs_on_it(big_guest: Guest, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    assert big_guest.healthy()
    with pytest.raises(EnvError, match=r"the guest's screen is 1920x1080, the cases need 1280x800 \(--retrace-screen\)"
                                       r": cases made on this guest declare `screen: \[1920, 1080\]` and run with "
                                       r"--retrace-screen 1920x1080"):
        _env(big_guest, monkeypatch, size=(1280, 800))
    env = _env(big_guest, monkeypatch, screenshot_budget="off")  # today's polling: the guest is ours
    assert env.ours and env.shots.cap is None
    case = load_case(_write_case(env, tmp_path, list(OSWORLD)))
    assert case.screen == OSWORLD
    opts = ReplayOptions(budget=2, strategy="explicit-none")
    before = env.shots.total
    polled = run_case(env, case, OracleAgent(), opts)
    polled_shots = env.shots.total - before
    assert polled.error is None, polled.error
    assert polled.recovered, (polled.r_o, polled.r_tc)
    # the same case, its screenshots counted and settled with backoff, as on an OSWorld VM
    env = _env(big_guest, monkeypatch, screenshot_budget="on")
    assert env.shots.cap == 150
    before = env.shots.total
    budgeted = run_case(env, case, OracleAgent(), opts)
    budgeted_shots = env.shots.total - before
    assert budgeted.error is None, budgeted.error
    assert budgeted.recovered, (budgeted.r_o, budgeted.r_tc)
    noop = run_case(env, case, NoopAgent(), opts)
    assert noop.error is None and not noop.recovered
    print(f"\n/screenshot calls of one oracle run of {case.id} at 1920x1080: polled every 30 ms {polled_shots} "
          f"({polled.timings['total']:.1f} s), budgeted with backoff {budgeted_shots} "
          f"({budgeted.timings['total']:.1f} s)")
    # fewer where grabs are cheap (33 against 60 here); on a machine so loaded that a 1080p grab outlasts the
    # first backoff intervals both poll about as often (the loopback test in test_remote_errors.py is exact)
    assert budgeted_shots <= polled_shots
    # a case of another screen on this guest: the replay's own refusal, a config error
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    doc = yaml.safe_load(Path(case.path).read_text())
    del doc["screen"]  # the default, 1280x800, with screenshots of that size
    for name in ("target", "error"):
        Image.open(tmp_path / f"{name}.png").crop((0, 0, 1280, 800)).save(other_dir / f"{name}.png")
    (other_dir / "case.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    other = load_case(other_dir / "case.yaml")
    refused = run_case(env, other, OracleAgent(), opts)
    assert refused.error is not None and refused.error.kind == "config"
    assert "environment screen (1920, 1080) != case screen (1280, 800)" in refused.error.message
