"""`retrace record` on a real desktop: a hand-written case gets its screenshots only if it passes the
same candidate check as `retrace build` (reproducible, transition-consistent, a real error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pytest_retrace import cli
from pytest_retrace.dataset.record import RecordingError, record_case
from pytest_retrace.envs.xvfb.environment import XvfbEnvironment
from pytest_retrace.replay.cases import load_case, load_png
from tests.helpers import REPO

from .test_build import GOOD, TASK

ALIAS = REPO / "tests" / "data" / "alias-case" / "alias-echo.yaml"


def write_case(root: Path, name: str, perturbation: list[str], task: dict[str, Any] = TASK,
               verified_by: str | None = None, **metadata: str) -> Path:
    path = root / f"{name}.yaml"
    doc = {"task": task, "trajectory": GOOD, "t_seed": 1, "perturbation": perturbation, "d": 1,
           "screenshots": {"target": f"{name}/target.png", "error": f"{name}/error.png"}, "metadata": metadata}
    if verified_by is not None:
        doc["verified_by"] = verified_by
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.desktop
def test_hidden_state_case_is_recorded_with_identical_screens(env: XvfbEnvironment, tmp_path: Path) -> None:
    path = write_case(tmp_path, "cd-away", ["pyautogui.write('cd /tmp && clear\\n')"], kind="hidden-state")
    # identical screens: without a probe replay could never tell whether the mistake happened
    with pytest.raises(RecordingError, match=r"cd-away\.yaml: probes: the error screen equals the target") as exc:
        record_case(path, env, replays=2)
    suggested = yaml.safe_load(str(exc.value).split("add:\n", 1)[1])
    assert [p["get"]["command"] for p in suggested["probes"]] == [
        "for p in /proc/[0-9]*; do readlink $p/cwd; done | sort -u"]  # the shell's working directory
    path.write_text(path.read_text() + yaml.safe_dump(suggested))
    rec = record_case(path, env, replays=2)
    assert "probe command 'for p in" in "\n".join(rec.checks)
    assert rec.kind == "hidden-state"
    assert "the remaining gt actions fail from it; SSIM(error, target) = 1.0000" in "\n".join(rec.checks)
    case = load_case(path)  # now with its screenshots, which load_case checks against the screen size
    assert np.array_equal(load_png(case.target_png), load_png(case.error_png))  # nothing on screen shows it


@pytest.mark.desktop
def test_visual_only_case_is_recorded(env: XvfbEnvironment, tmp_path: Path) -> None:
    # harmless to the evaluator but visibly off: a case only R_O can catch (recording used to reject these)
    path = write_case(tmp_path, "output-left", ["pyautogui.write('help | head -40\\n')"])
    rec = record_case(path, env, replays=2)
    assert rec.kind == "visual-only"
    assert "remaining gt actions succeed from it" in "\n".join(rec.checks)
    assert rec.case.error_png.is_file() and not np.array_equal(rec.target, rec.error)


@pytest.mark.desktop
def test_harmless_invisible_mistake_is_refused_and_nothing_written(env: XvfbEnvironment, tmp_path: Path) -> None:
    # the pointer is not drawn (Xvfb -nocursor) and moving it changes nothing: not a mistake at all
    path = write_case(tmp_path, "moved", ["pyautogui.moveTo(300, 300)"])
    with pytest.raises(RecordingError, match=r"moved\.yaml: not an error: .*screen matches the target \(SSIM 1\.0000"):
        record_case(path, env, replays=2)
    assert not (tmp_path / "moved").exists()


@pytest.mark.desktop
def test_harmless_mistake_meant_as_visible_is_refused(env: XvfbEnvironment, tmp_path: Path) -> None:
    path = write_case(tmp_path, "meant-visible", ["pyautogui.write('help | head -40\\n')"], kind="visible")
    with pytest.raises(RecordingError, match=r"not an error: .*intended visible"):
        record_case(path, env, replays=2)


@pytest.mark.desktop
def test_cli_records_the_good_case_and_names_the_broken_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_case(tmp_path, "output-left", ["pyautogui.write('help | head -40\\n')"])
    never = write_case(tmp_path, "never", ["pyautogui.write('zz')"], task={**TASK, "id": "never",
                       "evaluator": {**TASK["evaluator"], "expected": {"type": "rule", "rules": {"text": "y\n"}}}})
    assert cli.main(["record", str(never), str(good), "--replays", "2"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED {never}: full trajectory failed the evaluator on replay 1" in out
    assert f"recorded {good} (visual-only)" in out  # one broken case never stops the others
    assert (tmp_path / "output-left" / "target.png").is_file() and not (tmp_path / "never").exists()


def test_screenshots_are_written_inside_the_case_directory_only(tmp_path: Path) -> None:
    """No desktop: the write step alone. A screenshot directory swapped for a symlink after loading (the
    replays take minutes) must not redirect the write outside the case directory."""
    from pytest_retrace.dataset.record import _write_png

    case_dir, outside = tmp_path / "case", tmp_path / "outside"
    case_dir.mkdir()
    outside.mkdir()
    case = load_case(write_case(case_dir, "x", ["pyautogui.write('zz')"]), check_screenshots=False)
    pixels = np.zeros((2, 3, 3), dtype=np.uint8)
    _write_png(case, "screenshots.target", case.screenshots.target, pixels)
    assert load_png(case.target_png).shape == (2, 3, 3)
    assert [p.name for p in case.target_png.parent.iterdir()] == ["target.png"]  # no temporary file left
    (case_dir / "x" / "target.png").unlink()
    (case_dir / "x").rmdir()
    (case_dir / "x").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RecordingError, match=r"x\.yaml: screenshots\.error: 'x/error\.png' is outside the case dir"):
        _write_png(case, "screenshots.error", case.screenshots.error, pixels)
    assert list(outside.iterdir()) == []


def test_recorded_screenshots_are_kept_once_in_the_suites_shared_folder(tmp_path: Path) -> None:
    """No desktop: the write step alone. A recorded screen another case has too goes to cases/shared/, and a
    shared screenshot is never overwritten under the other cases that use it."""
    from pytest_retrace.dataset.record import write_screenshots

    suite = tmp_path / "cases"
    (suite / "shared").mkdir(parents=True)
    (suite / "app").mkdir()
    a, b = (load_case(write_case(suite / "app", name, ["pyautogui.write('zz')"]), check_screenshots=False)
            for name in ("a", "b"))
    black, white = np.zeros((2, 3, 3), dtype=np.uint8), np.full((2, 3, 3), 255, dtype=np.uint8)
    write_screenshots(a, black, white)
    write_screenshots(b, black, black)
    a, b = (load_case(c.path, check_screenshots=False) for c in (a, b))
    assert a.screenshots.target == b.screenshots.target == b.screenshots.error
    assert a.screenshots.target.startswith("../shared/screen-") and a.screenshots.error == "a/error.png"
    assert not (suite / "app" / "b").exists()
    write_screenshots(b, black, black)  # the same screens again: nothing changes
    with pytest.raises(RecordingError, match=r"b\.yaml: screenshots\.target: \.\./shared/screen-.*\.png is shared "
                                           r"with other cases and the recorded screen differs"):
        write_screenshots(b, white, black)
    assert np.array_equal(load_png(a.target_png), black)


@pytest.mark.desktop
def test_cli_record_goes_on_after_a_case_crashes_the_recorder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from pytest_retrace.dataset import record

    first = write_case(tmp_path, "first", ["pyautogui.write('zz')"])
    second = write_case(tmp_path, "second", ["pyautogui.write('zz')"])

    def flaky(path, env, **kwargs):
        if Path(path) == first:
            raise KeyError("a bug")
        return types.SimpleNamespace(kind="visible", checks=[])

    monkeypatch.setattr(record, "record_case", flaky)
    assert cli.main(["record", str(first), str(second)]) == 1
    out = capsys.readouterr().out
    assert f"FAILED {first}: unexpected KeyError: 'a bug'" in out and f"recorded {second} (visible)" in out


@pytest.mark.desktop
def test_an_alias_nothing_can_observe_is_recorded_only_when_declared(env: XvfbEnvironment, tmp_path: Path) -> None:
    """Issue 21 (15): `alias echo=false; clear` leaves the screen, the files and every process's cwd as they were,
    and the suffix's echo writes an empty file. Refused as unverifiable, with the way out; accepted when the case
    declares it is verified by its recorded determinism only, and the recording says so."""
    doc = yaml.safe_load(ALIAS.read_text())
    undeclared = tmp_path / "alias-echo.yaml"
    undeclared.write_text(yaml.safe_dump({k: v for k, v in doc.items() if k != "verified_by"}, sort_keys=False))
    with pytest.raises(RecordingError, match=r"alias-echo\.yaml: unverifiable: the error screen equals the target .*"
                                          r"declare `verified_by: determinism`"):
        record_case(undeclared, env, replays=3)
    assert not (tmp_path / "alias-echo").exists()
    declared = tmp_path / "declared.yaml"
    declared.write_text(yaml.safe_dump(doc, sort_keys=False))
    rec = record_case(declared, env, replays=3)
    assert rec.kind == "hidden-state" and rec.verified_by == "determinism" and rec.case.probes == []
    assert ("error state verified by determinism only (declared): no probe tells s_error from s_target, and the "
            "remaining gt actions failed from it on 3/3 replays") in "\n".join(rec.checks)
    assert np.array_equal(load_png(rec.case.target_png), load_png(rec.case.error_png))


@pytest.mark.desktop
def test_a_declaration_a_probe_or_the_screen_makes_needless_is_refused(env: XvfbEnvironment, tmp_path: Path) -> None:
    # `cd /tmp` shows in the shell's working directory: the probe, not the declaration, must verify it
    cd_away = write_case(tmp_path, "cd-away", ["pyautogui.write('cd /tmp && clear\\n')"], verified_by="determinism")
    with pytest.raises(RecordingError, match=r"cd-away\.yaml: verified_by: command 'for p in /proc.* tells s_error from "
                                          r"s_target on every one of 2 replays.*drop `verified_by: determinism` and add:"):
        record_case(cd_away, env, replays=2)
    typo = write_case(tmp_path, "typo", ["pyautogui.write('zz')"], verified_by="determinism")
    with pytest.raises(RecordingError, match=r"typo\.yaml: verified_by: the error screen differs from the target"):
        record_case(typo, env, replays=2)
    assert not (tmp_path / "cd-away").exists() and not (tmp_path / "typo").exists()
