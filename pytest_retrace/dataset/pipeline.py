"""`retrace build`: successful trajectories in, verified recovery cases out (paper 5.2 and A.1).

Stages, each writing one file in the work directory and skipped when that file exists (resumable:
delete a stage's file, or pass --from STAGE, to redo it and everything after it):

1. rollouts    trajectories from scripted policies / agent runs / OSWorld results, normalised; drops counted
2. consistent  replay each trajectory N times from reset; keep it only if all N succeed; the screen after
               every step is kept from these replays (the canonical target screenshots)
3. seeds       sample target steps t_seed per trajectory with a fixed seed (only steps whose screen was
               identical on every replay)
4. perturb     drive each target off track with the scripted catalogue; keep a candidate only if the error
               is real (Φ fails from the error state) or, for visual-only mistakes, visible; run twice and
               exclude anything nondeterministic; crashes excluded and counted. Each candidate's outcome is
               journaled (4-perturb.partial.jsonl) as it comes: an interrupted stage resumes where it stopped
5. final       drop near-identical errors unless hidden-state, drop duplicates, sample per domain, write
               case YAML + PNGs, print the paper's Table 6 (counts per stage) and Table 7 (domains)
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import shutil
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import TypeAdapter, ValidationError

from pytest_retrace.actions import Action, parse_action
from pytest_retrace.dataset.trajectory import Dropped, Trajectory, load_scripted, read_jsonl, write_jsonl
from pytest_retrace.dataset.verify import Rejected, execute, measured_kind, verify_candidate
from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.envs.steps import FileStep
from pytest_retrace.evaluators import LATE_WRITES, evaluate
from pytest_retrace.replay.cases import Task, load_png
from pytest_retrace.replay.probes import Getter, narrowest, standard_getters

STAGES = ("rollouts", "consistent", "seeds", "perturb", "final")
CATALOGUE = Path(__file__).with_name("perturbations")  # one file per group of apps
D_FOR_HORIZON = {"short": 1, "long": 5}
# how many actions a catalogue mistake of each horizon takes: a long-horizon mistake (d = 5) that is over in
# one or two actions would be a short one labelled long
ACTIONS_FOR_HORIZON = {"short": (1, 1), "long": (3, 5)}
INTENTS = ("visible", "hidden-state", "visual-only")
_GETTERS: TypeAdapter[Getter] = TypeAdapter(Getter)


@dataclass(frozen=True)
class Perturbation:
    name: str
    domains: tuple[str, ...]
    horizon: str
    intent: str
    mistake: str
    actions: tuple[Action, ...]
    probes: tuple[Getter, ...] = ()  # getters that may see what this mistake changed off screen

    @property
    def d(self) -> int:
        return D_FOR_HORIZON[self.horizon]


def load_catalogue(path: Path = CATALOGUE) -> list[Perturbation]:
    """The mistake catalogue: a YAML file, or a directory of them (read in name order). A malformed entry is
    a ValueError naming the file, the entry and the field; names must be unique across the files."""
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    out: list[Perturbation] = []
    for file in files:
        for p in _load_catalogue_file(file):
            if any(q.name == p.name for q in out):
                raise ValueError(f"{file}: entry {p.name}: the name is used twice in the catalogue {path}")
            out.append(p)
    return out


def _load_catalogue_file(path: Path) -> list[Perturbation]:
    raw_entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw_entries, list):
        raise ValueError(f"{path}: expected a list of perturbations")
    out = []
    for i, raw in enumerate(raw_entries):
        name = raw.get("name", "?") if isinstance(raw, dict) else repr(raw)
        where = f"{path}: entry {i} ({name})"
        missing = [k for k in ("name", "domains", "horizon", "intent", "mistake", "actions")
                   if not isinstance(raw, dict) or k not in raw]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if raw["horizon"] not in D_FOR_HORIZON:
            raise ValueError(f"{where}: horizon: {raw['horizon']!r} is not one of {', '.join(D_FOR_HORIZON)}")
        if raw["intent"] not in INTENTS:
            raise ValueError(f"{where}: intent: {raw['intent']!r} is not one of {', '.join(INTENTS)}")
        if not isinstance(raw["actions"], list):
            raise ValueError(f"{where}: actions: expected a list")
        try:
            actions = tuple(a for item in raw["actions"] for a in parse_action(item))
        except ValueError as exc:
            raise ValueError(f"{where}: actions: {exc}") from None
        unknown = set(raw) - {"name", "domains", "horizon", "intent", "mistake", "actions", "probes"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            probes = tuple(_GETTERS.validate_python(g) for g in raw.get("probes") or [])
        except ValidationError as exc:
            raise ValueError(f"{where}: probes: {exc.errors()[0]['msg']}") from None
        p = Perturbation(raw["name"], tuple(raw["domains"]), raw["horizon"], raw["intent"], raw["mistake"], actions,
                         probes)
        low, high = ACTIONS_FOR_HORIZON[p.horizon]
        if not low <= len(p.actions) <= high:
            raise ValueError(f"{where}: actions: a {p.horizon}-horizon mistake takes {low}..{high} actions, "
                             f"got {len(p.actions)}")
        out.append(p)
    return out


@dataclass(frozen=True)
class AgentPerturbation:
    """The paper's LLM perturbation agent: a model, prompted to make a realistic mistake from the target
    state within d actions (its actions become the candidate's perturbation, verified like a catalogue
    entry's). Its intent is unknown, so its kind is measured alone."""

    model: str
    horizon: str
    intent: None = None

    @property
    def name(self) -> str:
        return f"agent-{self.model}-{self.horizon}"

    @property
    def d(self) -> int:
        return D_FOR_HORIZON[self.horizon]


@dataclass
class BuildConfig:
    work: Path
    out: Path  # where the final case files go
    scripted: list[Path] = field(default_factory=list)
    osworld: list[Path] = field(default_factory=list)
    osworld_examples: Path | None = None
    osworld_cache: Path | None = None  # OSWorld's cache dir (<task_id>/<file>): files its tasks download
    agents: list[str] = field(default_factory=list)  # model configs rolled out on the scripted tasks
    perturb_agents: list[str] = field(default_factory=list)  # model configs making mistakes (besides the catalogue)
    agent_dirs: list[Path] = field(default_factory=lambda: [Path("agents")])
    replays: int = 3
    seeds_per_trajectory: int = 3
    seed: int = 0
    ssim_threshold: float = 0.99  # R_O's threshold: decides which half of the oracle sees an error
    # Near-identical errors are dropped unless hidden-state. Not 0.99: on this 1280x800 desktop a wrong
    # spreadsheet cell scores SSIM 0.993-0.998, yet it is a real, visible mistake worth keeping.
    near_identical: float = 0.999
    per_domain: int = 12
    perturbations_per_target: int = 6
    catalogue: Path = CATALOGUE


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]


def _save_png(arr: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, optimize=True)


def _with_own_files(task: Task, base_dir: Path, domain_dir: Path, case_dir: Path) -> Task:
    """`task` with the files its setup writes copied into the case's own directory (``<case>/setup/``): a case
    is read relative to its YAML, and must not depend on the rollout or OSWorld cache it was built from."""
    steps = []
    for i, step in enumerate(task.setup):
        if isinstance(step, FileStep) and step.src is not None:
            source = base_dir / step.src  # absolute for an imported OSWorld upload
            copy = case_dir / "setup" / f"{i}-{Path(step.src).name}"
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
            step = step.model_copy(update={"src": copy.relative_to(domain_dir).as_posix()})
        steps.append(step)
    copied: dict[str, str] = {}

    def own(node: Any) -> Any:
        # the evaluator's local_file getters (an expected file shipped with the rollout) likewise
        if isinstance(node, list):
            return [own(x) for x in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "local_file" and isinstance(node.get("path"), str):
            if node["path"] not in copied:
                copy = case_dir / "expected" / f"{len(copied)}-{Path(node['path']).name}"
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(base_dir / node["path"], copy)
                copied[node["path"]] = copy.relative_to(domain_dir).as_posix()
            return {**node, "path": copied[node["path"]]}
        return {k: own(v) for k, v in node.items()}

    return task.model_copy(update={"setup": steps, "evaluator": own(task.evaluator)})


def _job_key(job: tuple[Trajectory, int, Perturbation | AgentPerturbation]) -> str:
    traj, t_seed, p = job
    return f"{traj.id}@{t_seed}:{p.name}"


def _read_journal(path: Path) -> dict[str, Any]:
    """A stage's journal of finished jobs; a last line cut off by the interruption is skipped."""
    done: dict[str, Any] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            done[entry["job"]] = entry["outcome"]
    return done


def candidate_probes(traj: Trajectory, p: Perturbation | AgentPerturbation) -> list[Getter]:
    """The getters that may tell a candidate's error state from its target state, most specific first."""
    from pytest_retrace.replay.cases import vm_files

    getters: list[Getter] = [*(getattr(p, "probes", ()) or ()), *(_GETTERS.validate_python(g) for g in traj.probes)]
    getters += standard_getters(vm_files(traj.task.evaluator))
    return list(dict.fromkeys(getters))  # once each, in order


class Builder:
    """Runs the stages; replays are spread over one thread per environment (each thread owns one
    desktop exclusively; the work is subprocess and screenshot bound, so threads do run in parallel)."""

    def __init__(self, cfg: BuildConfig, envs: list[Environment], log: Any = print) -> None:
        self.cfg, self.envs, self.log = cfg, envs, log
        self._perturbers: dict[tuple[str, int], Any] = {}  # (model, id(env)) -> agent: one per desktop thread

    def _map(self, fn: Callable[[Environment, Any], Any], items: Iterable[Any]) -> list[Any]:
        from concurrent.futures import ThreadPoolExecutor

        pool: queue.Queue[Environment] = queue.Queue()
        for env in self.envs:
            pool.put(env)

        def call(item: Any) -> Any:
            env = pool.get()
            try:
                return fn(env, item)
            finally:
                pool.put(env)

        with ThreadPoolExecutor(max_workers=len(self.envs)) as ex:
            return list(ex.map(call, items))  # results in input order: the output stays deterministic

    def path(self, stage: str) -> Path:
        return self.cfg.work / f"{STAGES.index(stage) + 1}-{stage}.jsonl"

    def run(self, start: str | None = None) -> None:
        if start is not None:
            for stage in STAGES[STAGES.index(start):]:
                self.path(stage).unlink(missing_ok=True)
                self.path(stage).with_suffix(".partial.jsonl").unlink(missing_ok=True)
        for stage in STAGES:
            out = self.path(stage)
            if out.exists():
                items = read_jsonl(out)
                self.log(f"[{stage}] done already ({len(items)} kept; delete {out.name} to redo)")
                continue
            getattr(self, f"stage_{stage}")()

    # -- 1 ----------------------------------------------------------------------------------------
    def stage_rollouts(self) -> None:
        kept: list[Trajectory] = []
        dropped: list[Dropped] = []
        for root in self.cfg.scripted:
            for file in sorted(root.rglob("*.yaml")):
                (dropped if isinstance(t := load_scripted(file), Dropped) else kept).append(t)
        if self.cfg.agents:
            kept_agent, dropped_agent = self._agent_rollouts([t for t in kept if t.source.startswith("scripted:")])
            kept += kept_agent
            dropped += dropped_agent
        for root in self.cfg.osworld:
            from pytest_retrace.dataset.osworld import import_osworld

            trajs, drops = import_osworld(root, self.cfg.osworld_examples, cache_dir=self.cfg.osworld_cache)
            kept += trajs
            dropped += drops
        seen: dict[str, str] = {}
        unique = []
        for t in kept:  # an id names shots, cases and tests: a second trajectory with it would overwrite the first's
            if t.id in seen:
                dropped.append(Dropped(t.source, f"trajectory id {t.id!r} is already used by {seen[t.id]}"))
            else:
                seen[t.id] = t.source
                unique.append(t)
        kept = unique
        for d in dropped:
            self.log(f"  dropped {d.source}: {d.reason}")
        self._finish("rollouts", [t.to_json() for t in kept], dropped=len(dropped))

    def _agent_rollouts(self, scripted: list[Trajectory]) -> tuple[list[Trajectory], list[Dropped]]:
        """On-policy rollouts: each configured agent attempts every scripted task through the Agent protocol."""
        from pytest_retrace.agents import create_agent, load_model_config
        from pytest_retrace.dataset.trajectory import rollout_agent

        kept: list[Trajectory] = []
        dropped: list[Dropped] = []
        for name in self.cfg.agents:
            agent = create_agent(load_model_config(name, self.cfg.agent_dirs))
            try:
                for traj in scripted:
                    shots = self.cfg.work / "rollout-shots" / name / traj.id
                    got = rollout_agent(self.envs[0], traj.task, agent, traj.base_dir, shots_dir=shots)
                    (dropped if isinstance(got, Dropped) else kept).append(got)
            finally:
                agent.close()
        return kept, dropped

    # -- 2 ----------------------------------------------------------------------------------------
    def stage_consistent(self) -> None:
        kept = []
        dropped: Counter[str] = Counter()
        items = read_jsonl(self.path("rollouts"))
        for item, verdict in zip(items, self._map(self._replay_n, items)):
            if isinstance(verdict, str):
                dropped[verdict] += 1
            else:
                kept.append({**item, "reproducible_steps": verdict})
        self._finish("consistent", kept, **dropped)

    def _replay_n(self, env: Environment, item: dict[str, Any]) -> list[int] | str:
        traj = Trajectory.from_json(item)
        try:
            return self._replay_n_in(env, traj)
        except Rejected as exc:
            self.log(f"  {traj.id}: {exc}, excluded")
            return exc.reason
        except EnvError as exc:
            self.log(f"  {traj.id}: environment failure, excluded: {exc}")
            return "crash"

    def _replay_n_in(self, env: Environment, traj: Trajectory) -> list[int] | str:
        digests: list[list[str]] = []
        for replay in range(self.cfg.replays):
            env.reset(traj.task, traj.base_dir)
            shots = [env.screenshot()]
            for action in traj.actions:
                execute(env, action)
                shots.append(env.screenshot())
            ev = evaluate(traj.task.evaluator, env, traj.base_dir, wait=LATE_WRITES)
            if not ev.passed:
                self.log(f"  {traj.id}: replay {replay + 1} failed the evaluator, dropped: {ev.details}")
                return "inconsistent"
            digests.append([_digest(s) for s in shots])
            if replay == 0:
                for i, shot in enumerate(shots):
                    _save_png(shot, self.cfg.work / "shots" / traj.id / f"step-{i:03d}.png")
        same = [i for i in range(len(digests[0])) if len({d[i] for d in digests}) == 1]
        self.log(f"  {traj.id}: {self.cfg.replays}/{self.cfg.replays} successful replays, "
                 f"{len(same)}/{len(digests[0])} screens identical across replays")
        return same

    # -- 3 ----------------------------------------------------------------------------------------
    def stage_seeds(self) -> None:
        rng = random.Random(self.cfg.seed)
        seeds = []
        for item in read_jsonl(self.path("consistent")):
            n = len(item["steps"])
            # t_seed in 1..T-1: a target after at least one step, with at least one step left to replay
            pool = [t for t in item["reproducible_steps"] if 1 <= t <= n - 1]
            for t in sorted(rng.sample(pool, min(self.cfg.seeds_per_trajectory, len(pool)))):
                seeds.append({"trajectory": item["id"], "t_seed": t})
        self._finish("seeds", seeds)

    # -- 4 ----------------------------------------------------------------------------------------
    def stage_perturb(self) -> None:
        trajs = {i["id"]: Trajectory.from_json(i) for i in read_jsonl(self.path("consistent"))}
        catalogue = load_catalogue(self.cfg.catalogue)
        rng = random.Random(self.cfg.seed)
        jobs = []
        for seed in read_jsonl(self.path("seeds")):
            traj = trajs[seed["trajectory"]]
            for p in self._choose(rng, [p for p in catalogue if traj.task.domain in p.domains]):
                jobs.append((traj, seed["t_seed"], p))
            jobs += [(traj, seed["t_seed"], AgentPerturbation(model, horizon))
                     for model in self.cfg.perturb_agents for horizon in D_FOR_HORIZON]
        # the longest stage (every candidate replayed twice): each outcome is journaled as it comes, so a run
        # stopped half way (Ctrl-C, a reboot) resumes with the candidates it had not finished
        journal = self.path("perturb").with_suffix(".partial.jsonl")
        done = _read_journal(journal)
        if done:
            self.log(f"[perturb] resuming: {sum(_job_key(j) in done for j in jobs)} of {len(jobs)} candidates "
                     f"done already ({journal.name})")
        lock = threading.Lock()

        def perturb(env: Environment, job: tuple[Trajectory, int, Perturbation | AgentPerturbation]) -> Any:
            key = _job_key(job)
            if key in done:
                return done[key]
            outcome = self._perturb(env, job)
            with lock, journal.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"job": key, "outcome": outcome}) + "\n")
            return outcome

        kept, dropped = [], Counter()
        try:
            for outcome in self._map(perturb, jobs):
                if isinstance(outcome, str):
                    dropped[outcome] += 1
                else:
                    kept.append(outcome)
        finally:
            for agent in self._perturbers.values():
                agent.close()
            self._perturbers.clear()
        self._finish("perturb", kept, **dropped)
        journal.unlink(missing_ok=True)

    def _choose(self, rng: random.Random, applicable: list[Perturbation]) -> list[Perturbation]:
        """Per target: one mistake of each intended kind and horizon available, drawn with the fixed seed."""
        groups: dict[tuple[str, str], list[Perturbation]] = defaultdict(list)
        for p in applicable:
            groups[(p.intent, p.horizon)].append(p)
        return [rng.choice(groups[k]) for k in sorted(groups)][: self.cfg.perturbations_per_target]

    def _agent_mistake(self, env: Environment, traj: Trajectory, t_seed: int, target: np.ndarray,
                       p: AgentPerturbation) -> tuple[tuple[Action, ...], str] | str:
        """Let the perturbation agent act from the target state; its executed actions are the mistake."""
        from pytest_retrace.agents import AgentContext, create_agent, load_model_config
        from pytest_retrace.replay.drive import drive
        from pytest_retrace.replay.result import InfraError
        from pytest_retrace.screen.similarity import differing_pixels

        key = (p.model, id(env))
        if key not in self._perturbers:
            self._perturbers[key] = create_agent(load_model_config(p.model, self.cfg.agent_dirs))
        env.reset(traj.task, traj.base_dir)
        for action in traj.actions[:t_seed]:
            execute(env, action)
        if differing_pixels(env.screenshot(), target) > 0:
            return "target not reproduced"
        context = AgentContext(instruction=traj.task.instruction, mode="perturbation", strategy="perturbation",
                               budget=p.d, screen=tuple(env.size))
        try:
            ran = drive(env, self._perturbers[key], context, p.d)
        except InfraError as exc:
            self.log(f"  {traj.id}@{t_seed} {p.name}: {exc}, excluded")
            return "crash"
        done = [s for s in ran.steps if s.action["action"] not in ("done", "fail", "invalid")]
        if ran.failed_actions or any(s.error for s in done):
            return "perturbation agent failed"  # an action that did not run cleanly cannot be replayed
        if not done:
            return "perturbation agent did nothing"
        rationale = next((s.rationale for s in reversed(ran.steps) if s.rationale), "")
        return tuple(Action.from_dict(s.action) for s in done), " ".join(rationale.split())[:300]

    def _perturb(self, env: Environment, job: tuple[Trajectory, int, Perturbation | AgentPerturbation]
                 ) -> dict[str, Any] | str:
        traj, t_seed, p = job
        target = load_png(self.cfg.work / "shots" / traj.id / f"step-{t_seed:03d}.png")
        if isinstance(p, AgentPerturbation):
            try:
                made = self._agent_mistake(env, traj, t_seed, target, p)
            except Rejected as exc:
                return exc.reason
            except EnvError as exc:
                self.log(f"  {traj.id}@{t_seed} {p.name}: crash, excluded: {exc}")
                return "crash"
            if isinstance(made, str):
                return made
            actions, mistake = made
        else:
            actions, mistake = p.actions, p.mistake
        try:
            # twice: a candidate whose error state or outcome varies is not a case
            got = verify_candidate(env, traj.task, traj.base_dir, traj.actions[:t_seed], actions,
                                   traj.actions[t_seed:], runs=2, threshold=self.cfg.ssim_threshold,
                                   intent=p.intent, expect_target=target, probes=candidate_probes(traj, p))
        except Rejected as exc:
            return exc.reason
        except EnvError as exc:
            self.log(f"  {traj.id}@{t_seed} {p.name}: crash, excluded: {exc}")
            return "crash"
        probes = narrowest(got.probes)
        cid = f"{traj.id}-t{t_seed}-{p.name}"
        err_png = self.cfg.work / "shots" / "errors" / f"{cid}.png"
        _save_png(got.error, err_png)
        self.log(f"  {cid}: {got.kind} (SSIM {got.ssim:.4f}, remaining gt {'succeeds' if got.suffix_passes else 'fails'})")
        return {"id": cid, "trajectory": traj.id, "t_seed": t_seed, "perturbation": p.name, "intent": p.intent,
                "horizon": p.horizon, "d": p.d, "actions": [a.to_dict() for a in actions], "mistake": mistake,
                "kind": got.kind, "ssim": round(got.ssim, 6), "suffix_passes": got.suffix_passes,
                "identical": got.identical, "probes": [q.model_dump(mode="json") for q in probes],
                "error_state": got.error_state,
                "target_digest": _digest(target), "error_digest": _digest(got.error), "error_png": str(err_png)}

    # -- 5 ----------------------------------------------------------------------------------------
    def stage_final(self) -> None:
        trajs = {i["id"]: Trajectory.from_json(i) for i in read_jsonl(self.path("consistent"))}
        dropped = Counter()
        unique: dict[tuple[str, str, str], dict[str, Any]] = {}
        for cand in read_jsonl(self.path("perturb")):
            cand["kind"] = measured_kind(cand["suffix_passes"], cand["ssim"], self.cfg.ssim_threshold,
                                         cand["identical"])
            if cand["ssim"] >= self.cfg.near_identical and cand["kind"] != "hidden-state":
                dropped["near-identical"] += 1
                continue
            # the same two screens are one case, whichever task they came from, unless what lies behind them
            # (the files and probed state at s_error) differs
            key = (cand["target_digest"], cand["error_digest"], cand["error_state"])
            if key in unique:
                dropped["duplicate"] += 1
                continue
            unique[key] = cand
        by_domain: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for cand in unique.values():
            by_domain[trajs[cand["trajectory"]].task.domain].append(cand)
        rng = random.Random(self.cfg.seed)
        chosen = []
        for domain in sorted(by_domain):
            cands = sorted(by_domain[domain], key=lambda c: c["id"])
            # kinds in turn (each shuffled with the fixed seed), so that a domain's sample keeps every kind it
            # has, as evenly as the candidates allow, rather than the most common one
            per_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for c in cands:
                per_kind[c["kind"]].append(c)
            for group in per_kind.values():
                rng.shuffle(group)
            pick = []
            while len(pick) < self.cfg.per_domain and any(per_kind.values()):
                for kind in sorted(per_kind):
                    if per_kind[kind] and len(pick) < self.cfg.per_domain:
                        pick.append(per_kind[kind].pop(0))
            dropped["sampled out"] += len(cands) - len(pick)
            chosen += sorted(pick, key=lambda c: c["id"])
        if self.cfg.out.exists():
            shutil.rmtree(self.cfg.out)
        for cand in chosen:
            self._write_case(trajs[cand["trajectory"]], cand)
        self._finish("final", chosen, **dropped)
        self.tables(trajs, chosen)
        pairs = {(c["target_digest"], c["error_digest"]) for c in chosen}
        self.log(f"\n{len(chosen)} case(s): {len(pairs)} distinct (target, error) screen pairs, "
                 f"{len({c['target_digest'] for c in chosen})} distinct targets; "
                 f"{sum(bool(c['probes']) for c in chosen)} with error-state probes")

    def _write_case(self, traj: Trajectory, cand: dict[str, Any]) -> None:
        domain_dir = self.cfg.out / traj.task.domain
        case_dir = domain_dir / cand["id"]
        case_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.cfg.work / "shots" / traj.id / f"step-{cand['t_seed']:03d}.png", case_dir / "target.png")
        shutil.copy(cand["error_png"], case_dir / "error.png")
        truth = {
            "visible": "the error shows on screen and the remaining gt actions fail from it",
            "hidden-state": "the error screen equals the target pixel for pixel but the remaining gt actions "
                            "fail: only R_TC can catch it",
            "visual-only": "the remaining gt actions still succeed but the screen differs: only R_O can catch it",
            "subtle": "the error shows on screen, but too little for SSIM (>= threshold): only R_TC catches it",
        }[cand["kind"]]
        task = _with_own_files(traj.task, traj.base_dir, domain_dir, case_dir)
        doc = {
            "id": cand["id"],
            "task": task.model_dump(mode="json", exclude_defaults=True),
            "trajectory": [s.action.to_dict() for s in traj.steps],
            "t_seed": cand["t_seed"],
            "perturbation": cand["actions"],
            "d": cand["d"],
            "screenshots": {"target": f"{cand['id']}/target.png", "error": f"{cand['id']}/error.png"},
            **({"probes": cand["probes"]} if cand["probes"] else {}),
            "metadata": {
                "source_model": traj.source.split(":")[0], "source": traj.source, "horizon": cand["horizon"],
                "kind": cand["kind"], "intended_kind": cand["intent"], "perturbation": cand["perturbation"],
                "mistake": cand["mistake"],
                "ssim_error_vs_target": cand["ssim"], "suffix_passes_from_error": cand["suffix_passes"],
                "ground_truth": truth, "built_by": "retrace build",
            },
        }
        header = f"# Generated by `retrace build` from {traj.source}; do not edit by hand.\n"
        (domain_dir / f"{cand['id']}.yaml").write_text(
            header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110), encoding="utf-8")

    # -- reporting --------------------------------------------------------------------------------
    def _finish(self, stage: str, items: list[dict[str, Any]], **dropped: int) -> None:
        write_jsonl(self.path(stage), items)
        extra = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items()) if v)
        self.log(f"[{stage}] kept {len(items)}" + (f"; excluded {extra}" if extra else ""))

    def tables(self, trajs: dict[str, Trajectory], chosen: list[dict[str, Any]]) -> None:
        counts = [(s, len(read_jsonl(self.path(s)))) for s in STAGES]
        self.log("\nTable 6: counts after each stage")
        labels = {"rollouts": "# of traj. after formatting", "consistent": "# of traj. after transition-consistent "
                  "filtering", "seeds": "# of (traj., t_seed) targets", "perturb": "# of candidates after perturbation",
                  "final": "# of cases after final set construction"}
        for stage, n in counts:
            self.log(f"  {labels[stage]:<52} {n:>5}")
        self.log("\nTable 7: domain composition of the final set")
        table: dict[str, Counter[str]] = defaultdict(Counter)
        for c in chosen:
            dom = trajs[c["trajectory"]].task.domain
            table[dom][c["kind"]] += 1
            table[dom][c["horizon"]] += 1
        cols = ["visible", "subtle", "hidden-state", "visual-only", "short", "long"]
        self.log("  " + f"{'domain':<14}" + "".join(f"{c:>14}" for c in cols) + f"{'total':>8}")
        for dom in sorted(table):
            total = sum(table[dom][k] for k in cols[:4])
            self.log("  " + f"{dom:<14}" + "".join(f"{table[dom][c]:>14}" for c in cols) + f"{total:>8}")
        self.log(f"  {'all':<14}" + "".join(f"{sum(t[c] for t in table.values()):>14}" for c in cols)
                 + f"{len(chosen):>8}")

