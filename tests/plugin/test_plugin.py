"""The plugin end to end: real pytest sessions (pytester, in a subprocess) over the built-in cases on
real desktops. Calibration, xdist equivalence, pytest options, infra errors, teardown."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import assert_no_leftovers, groups, interruptible, records, summary

pytest_plugins = ["pytester"]


@pytest.mark.desktop
def test_calibration_and_identical_summaries_with_and_without_xdist(project: pytest.Pytester) -> None:
    serial = project.runpytest_subprocess("--retrace-model=oracle,noop", "--retrace-run=n0", "-p", "no:randomly")
    serial.assert_outcomes(passed=6, failed=6)
    assert_no_leftovers(project)  # also after failing tests
    parallel = project.runpytest_subprocess("--retrace-model=oracle,noop", "--retrace-run=n2", "-n", "2")
    parallel.assert_outcomes(passed=6, failed=6)
    assert_no_leftovers(project)

    s0, s2 = summary(project, "n0"), summary(project, "n2")
    for s in (s0, s2):
        g = groups(s)
        assert (g["oracle"]["n"], g["oracle"]["recovered"], g["oracle"]["errors"]) == (6, 6, 0)
        assert (g["noop"]["n"], g["noop"]["recovered"], g["noop"]["errors"]) == (6, 0, 0)
        assert g["noop"]["r_tc_rate"] == 0.0  # every perturbation is a real error
    s0.pop("run"), s2.pop("run")
    assert s0 == s2
    # the terminal shows the per-model table
    serial.stdout.fnmatch_lines(["*retrace recovery summary*", "model*strategy*r*n*recovered*rate*95% CI*",
                                 "noop*implicit*10*6*0*0.0%*", "oracle*explicit-none*10*6*6*100.0%*"])
    recs = records(project, "n2")
    assert len(recs) == 12 and {r["verdict"] for r in recs} == {"recovered", "not_recovered"}
    assert all(r["timings"]["total"] > 0 and r["actions"] for r in recs)


@pytest.mark.desktop
def test_failure_message_says_what_failed(project: pytest.Pytester) -> None:
    res = project.runpytest_subprocess("--retrace-model=noop", "-k", "typo-short")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines([
        "*case typo-short not recovered: R_O=True, R_TC=False*",
        "*R_O ok: SSIM 0.99* >= 0.99*",
        "*R_TC failed: evaluator score 0 after replaying the remaining 2 gt action(s)*",
        "*'Hello xyzworld' != 'Hello world'*",
    ])
    res = project.runpytest_subprocess("--retrace-model=noop", "-k", "select-all-short")
    res.stdout.fnmatch_lines(["*R_O failed: SSIM 0.9* < 0.99; * px differ within x=*"])
    artifacts = list((project.path / "reports").glob("*/artifacts/*select-all-short-noop*/diff.png"))
    assert artifacts, "a failed recovery keeps its recovered screenshot and diff"


@pytest.mark.desktop
def test_k_x_v_and_lf_behave_as_in_pytest(project: pytest.Pytester) -> None:
    res = project.runpytest_subprocess("--retrace-model=oracle,noop", "-k", "typo or wrong-cell", "-v")
    res.assert_outcomes(passed=2, failed=2)
    assert "cases/mousepad/typo-short.yaml::test_recovery[typo-short-oracle-explicit-none-r10] PASSED" in res.stdout.str()
    res = project.runpytest_subprocess("--retrace-model=oracle,noop", "--lf", "-v")
    res.assert_outcomes(failed=2)  # only the two noop failures are re-run
    res.stdout.fnmatch_lines(["*run-last-failure: rerun previous 2 failures*"])
    res = project.runpytest_subprocess("--retrace-model=noop", "-x")
    res.assert_outcomes(failed=1)
    assert_no_leftovers(project)


@pytest.mark.desktop
def test_infrastructure_failures_are_errors_excluded_from_rates(project: pytest.Pytester) -> None:
    cases = project.path / "cases" / "mousepad"
    # a recorded target that the replay cannot reproduce: a replay desync, not an agent failure
    shutil.copy(cases / "select-all-short" / "target.png", cases / "typo-short" / "target.png")
    # an app that is not installed: the environment cannot even reach the task's initial state
    broken = (cases / "overwrite-long.yaml").read_text().replace("command: [mousepad,", "command: [no-such-editor,")
    (cases / "overwrite-long.yaml").write_text(broken)
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-run=infra", "-k", "mousepad",
                                       "--retrace-attempts=2")
    res.assert_outcomes(passed=1, errors=2)
    res.stdout.fnmatch_lines(["*infrastructure error (env) at stage reset*no-such-editor is not installed*",
                              "*infrastructure error (desync)*could not reproduce*target state off: * px differ within*"])
    g = groups(summary(project, "infra"))["oracle"]
    assert (g["n"], g["recovered"], g["errors"], g["rate"]) == (1, 1, 2, 1.0)
    kinds = {r["case"]: r["error"]["kind"] for r in records(project, "infra") if r["verdict"] == "error"}
    assert kinds == {"typo-short": "desync", "overwrite-long": "env"}


@pytest.mark.desktop
def test_ctrl_c_keeps_finished_results_leaves_no_process_and_resume_runs_the_rest(project: pytest.Pytester) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--retrace-model=oracle,noop", "--retrace-run=cc",
                             "-n", "2", "-p", "no:cacheprovider"], cwd=project.path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=interruptible)
    results = project.path / "reports" / "cc" / "results.jsonl"
    deadline = time.monotonic() + 600  # a condition, not a time: CI once took 160 s for the first test under load
    while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 2):
        time.sleep(0.2)
    assert results.exists() and results.read_text().count("\n") >= 2, "two tests did not finish within 600 s"
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    finished = results.read_text().count("\n")
    assert 2 <= finished < 12, out.decode()[-2000:]
    assert all(json.loads(line)["verdict"] in ("recovered", "not_recovered") for line in results.read_text().splitlines())
    assert_no_leftovers(project)
    # resuming runs only what is missing; the summary covers the whole run, each test once
    res = project.runpytest_subprocess("--retrace-model=oracle,noop", "--retrace-resume=cc", "-n", "2",
                                       "-p", "no:cacheprovider")
    res.stdout.fnmatch_lines([f"*workers [[]{12 - finished} items[]]*"])  # the finished ones are deselected
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == len({r["nodeid"] for r in lines}) == 12
    g = groups(summary(project, "cc"))
    assert (g["oracle"]["recovered"], g["oracle"]["n"], g["noop"]["recovered"], g["noop"]["n"]) == (6, 6, 0, 6)
    # rerunning a failure under the same run does not replace its verdict (no best-of-k), and says so
    res = project.runpytest_subprocess("--retrace-model=noop", "--retrace-run=cc", "-k", "typo-short",
                                       "-p", "no:cacheprovider")
    res.stdout.fnmatch_lines(["*1 rerun(s) of tests that already had a verdict in this run were ignored*"])
    s = summary(project, "cc")
    assert (groups(s)["noop"]["n"], s["n_records"], s["n_ignored_reruns"]) == (6, 12, 1)
    res = project.runpytest_subprocess("--retrace-model=noop", "--retrace-resume=no-such-run")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--retrace-resume: *no-such-run holds no results.jsonl: nothing to resume*"])


@pytest.mark.desktop
def test_own_hooks_receive_every_record_and_the_summary(project: pytest.Pytester) -> None:
    project.makeconftest('''
import json
import re

def pytest_configure(config):
    config._seen = []

def pytest_retrace_record(record, config):
    config._seen.append(record.nodeid)

def pytest_retrace_summary(summary, run_dir, config):
    with open("hook-output.json", "w") as fh:
        json.dump({"records": config._seen, "groups": summary["groups"], "run_dir": run_dir}, fh)
''')
    res = project.runpytest_subprocess("--retrace-model=noop,oracle", "-k", "typo-short", "-n", "2")
    res.assert_outcomes(passed=1, failed=1)
    out = json.loads((project.path / "hook-output.json").read_text())
    assert sorted(n.split("[")[1] for n in out["records"]) == ["typo-short-noop-implicit-r10]", "typo-short-oracle-explicit-none-r10]"]
    assert {g["model"]: g["recovered"] for g in out["groups"]} == {"noop": 0, "oracle": 1}


# --- broken case files (collection only: no desktop) ------------------------------------------------


def test_each_broken_case_file_is_one_collection_error_and_the_good_case_is_collected(
    pytester: pytest.Pytester,
) -> None:
    """Whatever is wrong with a case file, even a bug in the loader, it stops only that file."""
    import copy

    import yaml

    from tests.helpers import VALID, write_case

    cases = pytester.path / "cases"
    write_case(cases, "good", VALID)
    wait_null = copy.deepcopy(VALID)
    wait_null["trajectory"][1] = {"action": "wait", "seconds": None}
    write_case(cases, "wait-null", wait_null)
    keys_number = copy.deepcopy(VALID)
    keys_number["trajectory"][1] = {"action": "key", "keys": 5}  # once a TypeError: INTERNALERROR
    write_case(cases, "keys-number", keys_number)
    write_case(cases, "duplicate-key", yaml.safe_dump(VALID, sort_keys=False) + "d: 2\n")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    write_case(cases, "alias-bomb", bomb)
    write_case(cases, "crash", VALID)
    # a loader bug: any exception, not only CaseError, must stay this one file's collection error
    pytester.makeconftest('''
import pytest_retrace.plugin.collection as plugin

real = plugin.load_case

def crashing(path, **kwargs):
    if path.name == "crash.yaml":
        raise RuntimeError("loader bug")
    return real(path, **kwargs)

plugin.load_case = crashing
''')
    (pytester.path / "agents").mkdir()
    (pytester.path / "agents" / "noop.yaml").write_text("provider: noop\n")
    res = pytester.runpytest_subprocess("--collect-only", "-q", "--retrace-model=noop", "--retrace-cases=cases",
                                        "--retrace-agents=agents", "-p", "no:cacheprovider", "cases")
    out = res.stdout.str()
    assert res.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "INTERNALERROR" not in out + res.stderr.str()
    assert "cases/good.yaml::test_recovery[good-noop-implicit-r10]" in res.stdout.lines
    res.stdout.fnmatch_lines(["1 test collected, 5 errors in *"])
    for name, message in [
        ("wait-null", "trajectory[1]: wait: seconds must be a number, got None"),
        ("keys-number", "trajectory[1]: key: keys must be a key name or a list of key names, got 5"),
        ("duplicate-key", "line 43, column 1: invalid YAML: found duplicate key 'd'"),
        ("alias-bomb", "line 1, column 23: invalid YAML: more than 10000 values once aliases are expanded"),
        ("crash", "unexpected RuntimeError while loading the case: loader bug"),
    ]:
        assert out.count(f"ERROR collecting cases/{name}.yaml") == 1, out
        assert f"{cases / name}.yaml: {message}" in out, out


# --- case and agent directories anywhere (collection only: no desktop) ------------------------------


def test_case_and_agent_directories_outside_the_project_work(pytester: pytest.Pytester,
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """pytest picks its rootdir before it knows the plugin's options: `--retrace-cases DIR` once moved the
    rootdir to DIR (the project's ini was lost) and collected nothing, or the project's own tests."""
    from tests.helpers import VALID, write_case

    project = pytester.path
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
                                            'retrace_report_dir = "my-reports"\n')
    (project / "tests").mkdir()
    (project / "tests" / "test_own.py").write_text("def test_own():\n    pass\n")
    outside = tmp_path_factory.mktemp("elsewhere")
    write_case(outside / "cases", "good", VALID)
    (outside / "agents").mkdir()
    (outside / "agents" / "noop.yaml").write_text("provider: noop\n")
    joined = [f"--retrace-cases={outside / 'cases'}", f"--retrace-agents={outside / 'agents'}"]
    res = pytester.runpytest_subprocess("--collect-only", "--retrace-model=noop", *joined, "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK, res.stdout.str()
    res.stdout.fnmatch_lines([f"rootdir: {project}", "configfile: pyproject.toml",  # the project's ini still holds
                              "*<Function test_recovery[[]good-noop-implicit-r10[]]>", "*1 test collected*"])
    assert "test_own" not in res.stdout.str()  # the suite, not the project's own tests
    # the space form under plain pytest: a clear usage error instead of a run with the wrong settings
    res = pytester.runpytest_subprocess("--collect-only", "-q", "--retrace-model=noop", "--retrace-cases",
                                        str(outside / "cases"), f"--retrace-agents={outside / 'agents'}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"*--retrace-cases {outside / 'cases'}: pytest took * for a test path*"
                              f"Write --retrace-cases={outside / 'cases'}, or use `retrace run`*"])
    # `retrace run` passes the option so that pytest knows it for what it is
    retrace = Path(sys.executable).with_name("retrace")
    run = subprocess.run([str(retrace), "run", "--model", "noop", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--retrace-cases", str(outside / "cases"), "--retrace-agents", str(outside / "agents")],
                         cwd=project, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_recovery[good-noop-implicit-r10]" in run.stdout and "test_own" not in run.stdout


def test_space_form_path_options_say_the_rootdir_moved_before_any_model_lookup(
        pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The moved rootdir moves the default agents/ too: the model lookup used to fail first and blame the
    model ("no noop.yaml in DIR/agents"), hiding the real cause."""
    from tests.helpers import VALID, write_case

    (pytester.path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    (pytester.path / "agents").mkdir()
    (pytester.path / "agents" / "noop.yaml").write_text("provider: noop\n")
    outside = tmp_path_factory.mktemp("elsewhere")
    write_case(outside / "cases", "good", VALID)
    (outside / "reports").mkdir()
    for option, value in [("--retrace-cases", outside / "cases"), ("--retrace-report-dir", outside / "reports")]:
        res = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", "--retrace-model=noop",
                                            option, str(value))
        assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str() + res.stderr.str()
        errors = [line for line in res.stderr.lines if line.startswith("ERROR")]
        assert errors and errors[0].startswith(f"ERROR: {option} {value}: pytest took {value} for a test path"), errors
        assert "noop.yaml" not in res.stderr.str()


def test_retrace_run_exits_4_on_a_usage_error_its_own_parser_or_pytest_finds(
        pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    """README (Exit status): `retrace run` exits 4 on a usage error, pytest's USAGE_ERROR, whichever parser sees
    it: a misspelt --model (retrace's, argparse's 2 before) and a misspelt pytest option (pytest's)."""
    from pytest_retrace import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--modle", "noop"])
    assert exited.value.code == pytest.ExitCode.USAGE_ERROR
    assert "retrace run: error: the following arguments are required: --model" in capsys.readouterr().err
    retrace = Path(sys.executable).with_name("retrace")
    run = subprocess.run([str(retrace), "run", "--model", "noop", "--colect-only", "-p", "no:cacheprovider"],
                         cwd=pytester.path, capture_output=True, text=True, timeout=120)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "unrecognized arguments: --colect-only" in run.stderr
    # the other commands keep argparse's 2 for a bad option (their own errors exit 2 as well)
    with pytest.raises(SystemExit) as exited:
        cli.main(["validate", "--bogus"])
    assert exited.value.code == 2


def test_dry_run_counts_only_the_selected_tests(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """-k, --deselect and --lf deselect after the suite is collected: the dry run lists and counts what is left
    (it once listed all 502 built-in tests and their calls with 2 selected). Collection only: no desktop."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    # claude at r=1: 2 calls per turn x (2r + 2) turns = 8 calls per test
    base = ("--retrace-model=claude", "--retrace-strategy=implicit", "--retrace-budget=1", "--retrace-dry-run")
    typo = "cases/mousepad/typo-short.yaml::test_recovery[typo-short-claude-sonnet-4.6-implicit-r1]"
    wrong = "cases/gnumeric/wrong-cell-short.yaml::test_recovery[wrong-cell-short-claude-sonnet-4.6-implicit-r1]"

    def dry_run(*args: str) -> str:
        res = project.runpytest_subprocess(*base, *args)
        assert res.ret == pytest.ExitCode.OK, res.stdout.str() + res.stderr.str()
        return res.stdout.str()

    out = dry_run("-p", "no:cacheprovider")
    assert "6 test(s); at most 48 model calls in all" in out and typo in out
    out = dry_run("-p", "no:cacheprovider", "-k", "typo-short")
    assert f"{typo}  (at most 8 model calls)" in out and "1 test(s); at most 8 model calls in all" in out
    assert "wrong-cell-short" not in out.split("retrace dry run")[1]
    out = dry_run("-p", "no:cacheprovider", "--deselect", typo)
    assert "5 test(s); at most 40 model calls in all" in out and typo not in out.split("retrace dry run")[1]
    # --lf reads pytest's cache of the last failures (the file pytest's cacheprovider writes after a run)
    lastfailed = project.path / ".pytest_cache" / "v" / "cache" / "lastfailed"
    lastfailed.parent.mkdir(parents=True)
    lastfailed.write_text(json.dumps({typo: True, wrong: True}))
    out = dry_run("--lf")
    listed = out.split("retrace dry run")[1]
    assert typo in listed and wrong in listed and "2 test(s); at most 16 model calls in all" in listed, out


@pytest.mark.desktop
def test_repeated_runs_are_recorded_with_their_index_and_summarised(project: pytest.Pytester) -> None:
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-runs=2", "-k", "typo-short",
                                       "--retrace-run=k2", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    assert sorted(r["run_index"] for r in records(project, "k2")) == [0, 1]
    g = groups(summary(project, "k2"))["oracle"]
    assert (g["runs"], g["rate_mean"], g["rate_sd"], g["success_at"]) == (2, 1.0, 0.0, {"1": 1.0, "2": 1.0})
    res.stdout.fnmatch_lines(["*runs: mean ± sd*", "*100.0 ± 0.0 (2)*@1 100.0% @2 100.0%*"])


@pytest.mark.desktop
def test_a_worker_killed_mid_case_is_an_error_of_that_test_not_a_lost_one(project: pytest.Pytester) -> None:
    from tests.replay.test_scoring import PROBE

    project.makeconftest(PROBE + '''
import signal

class Suicidal(Probe):
    def start(self, context):
        os.kill(os.getpid(), signal.SIGKILL)  # the xdist worker dies in the middle of the case

register_agent("suicidal", Suicidal)
''')
    (project.path / "agents" / "suicidal.yaml").write_text("provider: suicidal\n")
    res = project.runpytest_subprocess("--retrace-model=noop,suicidal", "-k", "typo-short or select-all", "-n", "2",
                                       "--retrace-run=crash", "-p", "no:cacheprovider")
    # pytest's own count agrees with the records: the killed tests are errors, not failed recoveries
    res.assert_outcomes(failed=2, errors=2)
    res.stdout.fnmatch_lines(["*= ERRORS =*", "*ERROR at [?][?][?] of cases/mousepad/*",
                              "*worker 'gw?' crashed while running '*-suicidal-implicit-r10]'"])
    by_model: dict[str, list[dict]] = {}
    for r in records(project, "crash"):
        by_model.setdefault(r["model"], []).append(r)
    assert len(by_model["noop"]) == 2 and all(r["verdict"] == "not_recovered" for r in by_model["noop"])
    assert len(by_model["suicidal"]) == 2, res.stdout.str()[-3000:]
    domains = {r["case"]: r["domain"] for r in by_model["noop"]}
    assert all(r["verdict"] == "error" and r["error"]["kind"] == "crash" and r["domain"] == domains[r["case"]]
               and "crashed while running" in r["error"]["message"] for r in by_model["suicidal"])
    g = groups(summary(project, "crash"))["suicidal"]
    assert (g["n"], g["errors"]) == (0, 2)
    assert_no_leftovers(project)


def _in_a_terminal(argv: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """Run a command on a pseudo-terminal (as a person at a terminal would): exit status and all output."""
    import pty
    import select

    main, other = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, stdin=other, stdout=other, stderr=other, close_fds=True)
    os.close(other)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([main], [], [], 0.5)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other end closed: the command is done
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    return proc.wait(timeout=30), out.decode(errors="replace")


@pytest.mark.desktop
def test_retrace_run_prints_a_line_per_test_and_a_live_progress_line(project: pytest.Pytester) -> None:
    """Under xdist, at a terminal: one line per test with its verdict (pytest's own lines, two per test with
    -v under xdist, are gone), a live line naming case, model and stage while tests run, no traceback."""
    retrace = Path(sys.executable).with_name("retrace")
    code, out = _in_a_terminal([str(retrace), "run", "--model", "noop,oracle", "-n", "2", "-k",
                                "typo-short or select-all", "--retrace-run=lines", "-p", "no:cacheprovider"],
                               project.path)
    assert code == 0, out[-3000:]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    lines = [seg for line in plain.splitlines() for seg in line.split("\r")]
    results = [line.strip() for line in lines if re.match(r"\s*\[\d/4\] ", line)]
    assert len(results) == 4, plain[-3000:]
    assert sorted(r.split("] ")[0] for r in results) == ["[1/4", "[2/4", "[3/4", "[4/4"]
    [noop_typo] = [r for r in results if "typo-short" in r and "noop" in r]
    assert re.search(r"NOT RECOVERED +typo-short +noop · implicit · r=10 +R_O ok \(0\.99\d\d\), R_TC failed, "
                     r"0/10 actions", noop_typo), noop_typo
    assert sum("RECOVERED " in r and "NOT" not in r for r in results) == 2
    assert "test_recovery[" not in plain and "[gw" not in plain and "Traceback" not in plain
    live = [line for line in lines if line.startswith("running ")]
    assert any(re.search(r"running [12]: (typo-short|select-all-short) \((noop|oracle)\) \w+", line)
               for line in live), plain[-3000:]
    assert "retrace recovery summary" in plain and "2 failed, 2 passed" in plain
    run = project.path / "reports" / "lines"
    assert not (run / ".progress").exists()  # the live line's files are gone
    # the run's own report: summary.md with its tables, and the plots as real, non-blank PNG images
    assert "| noop | implicit | 10 | 2 | 0 |" in (run / "summary.md").read_text()
    from PIL import Image

    assert not (run / "plots" / "budget.png").exists()  # one r: no rate-against-r figure
    for name in ("rates", "domains", "kinds", "horizons", "criteria"):
        with Image.open(run / "plots" / f"{name}.png") as image:
            assert image.format == "PNG" and min(image.size) > 100
            assert len(image.convert("RGB").getcolors(1 << 20) or []) > 2, name


@pytest.mark.desktop
def test_retrace_run_measures_and_the_gate_decides(project: pytest.Pytester) -> None:
    """`retrace run` exits 0 on a completed run whatever the agents scored; with a gate option the gate
    decides, under plain pytest as well."""
    retrace = Path(sys.executable).with_name("retrace")
    run = subprocess.run([str(retrace), "run", "--model", "noop", "-k", "typo-short", "--retrace-run=measure",
                          "-p", "no:cacheprovider"], cwd=project.path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\[1/1\] NOT RECOVERED +typo-short", run.stdout), run.stdout
    assert "running " not in run.stdout  # not a terminal: no live line in a CI log
    assert "Traceback" not in run.stdout and "R_TC failed: evaluator" not in run.stdout  # no explanation
    assert "retrace recovery summary" in run.stdout
    res = project.runpytest_subprocess("--retrace-model=noop", "-k", "typo-short", "--retrace-fail-under=0.5",
                                       "--retrace-run=gate-fail", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*retrace gate: FAILED*",
                              "*noop implicit r=10: recovery rate 0.0% < --retrace-fail-under 50.0% (n=1)*"])
    assert summary(project, "gate-fail")["gate"]["passed"] is False
    res = project.runpytest_subprocess("--retrace-model=oracle", "-k", "typo-short", "--retrace-fail-under=0.5",
                                       "--retrace-max-errors=0", "--retrace-run=gate-pass", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK
    res.stdout.fnmatch_lines(["*retrace gate: passed*"])
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-fail-under=50", "--collect-only")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--retrace-fail-under: a share in 0..1, got 50*"])


@pytest.mark.desktop
def test_a_planted_regression_against_a_saved_baseline_fails_the_gate(project: pytest.Pytester) -> None:
    """Two real runs of one model config: the oracle's verdicts saved as baseline, then the same name backed
    by noop (6 of 6 shared cases lost: McNemar p = 0.03) fails; the same agent again passes."""
    cand = project.path / "agents" / "cand.yaml"
    cand.write_text("provider: oracle\n")
    res = project.runpytest_subprocess("--retrace-model=cand", "--retrace-run=base", "--retrace-save-baseline=v1",
                                       "-n", "2", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=6)
    assert (project.path / "reports" / "baselines" / "v1.json").is_file()
    res = project.runpytest_subprocess("--retrace-model=cand", "--retrace-run=same", "--retrace-baseline=v1",
                                       "-n", "2", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK
    res.stdout.fnmatch_lines(["*retrace gate: passed*"])
    cand.write_text("provider: noop\n")
    res = project.runpytest_subprocess("--retrace-model=cand", "--retrace-run=worse", "--retrace-baseline=v1",
                                       "-n", "2", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*retrace gate: FAILED*", "*regression: cand implicit r=10: 100.0% -> 0.0% on 6 shared "
                              "case(s) (lost 6, gained 0; McNemar exact p = 0.0312)*"])
    gate = summary(project, "worse")["gate"]
    assert gate["passed"] is False and gate["baseline"]["groups"][0]["regressed"] is True
    res = project.runpytest_subprocess("--retrace-model=cand", "--retrace-baseline=nope", "--collect-only")
    assert res.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.desktop
def test_checkpoint_restores_give_the_replays_verdicts(project: pytest.Pytester) -> None:
    """--retrace-restore=checkpoint: each case replays once (on the worker its tests go to), taking the
    checkpoint, and every other test of it restores it; the verdicts are the replays' (oracle all, noop none);
    nothing is left."""
    from tests.envs.test_checkpoint import _SKIP

    if _SKIP is not None:
        pytest.skip(_SKIP)
    res = project.runpytest_subprocess("--retrace-model=oracle,noop", "--retrace-runs=2", "--retrace-run=cp",
                                       "--retrace-restore=checkpoint", "-n", "2")
    res.assert_outcomes(passed=12, failed=12)
    res.stdout.fnmatch_lines(["*s_error restored from checkpoints*"])
    assert_no_leftovers(project)
    g = groups(summary(project, "cp"))
    assert (g["oracle"]["recovered"], g["noop"]["recovered"], g["oracle"]["errors"] + g["noop"]["errors"]) == (12, 0, 0)
    recs = records(project, "cp")
    replayed = [r for r in recs if "reset" in r["timings"]]  # the tests that took a case's checkpoint
    assert sorted(r["case"] for r in replayed) == sorted({r["case"] for r in recs})
    assert all(r["reconstruction"]["restore"] == ("replay (checkpoint taken)" if r in replayed else "checkpoint")
               for r in recs)


@pytest.mark.desktop
def test_checkpoints_unavailable_replay_and_say_why(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRACE_CRIU", "/nonexistent/criu")
    res = project.runpytest_subprocess("--retrace-model=oracle", "-k", "typo-short", "--retrace-run=nocp",
                                       "--retrace-restore=checkpoint")
    res.assert_outcomes(passed=1)
    (rec,) = records(project, "nocp")
    assert rec["reconstruction"]["restore"].startswith("replay (checkpoints unavailable: criu (/nonexistent/criu)")


def test_an_unknown_restore_mode_is_a_usage_error(project: pytest.Pytester) -> None:
    res = project.runpytest_subprocess("--retrace-model=oracle", "--retrace-restore=snapshot")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--retrace-restore: 'snapshot' is not one of replay, checkpoint*"])
