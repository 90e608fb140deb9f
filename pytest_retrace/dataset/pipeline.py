"""`retrace build`: successful trajectories in, verified recovery cases out (paper 5.2 and A.1).

Stages, each writing one file in the work directory and skipped when that file exists (resumable:
delete a stage's file, or pass --from STAGE, to redo it and everything after it):

1. rollouts    trajectories from scripted policies / agent runs / OSWorld results, normalised; drops counted
2. consistent  replay each trajectory N times from reset; keep it only if all N succeed; the screen after
               every step is kept from these replays (the canonical target screenshots)
3. seeds       sample target steps t_seed per trajectory with a fixed seed (only steps whose screen was
               identical on every replay)
4. perturb     drive each target off track with the scripted catalogue (and the perturbation agents:
               perturb_agent.py, whose budget --protocol decides); keep a candidate only if the error
               is real (Φ fails from the error state) or, for visual-only mistakes, visible; run twice and
               exclude anything nondeterministic; crashes excluded and counted. Each candidate's outcome is
               journaled (4-perturb.partial.jsonl) as it comes: an interrupted stage resumes where it stopped
5. final       drop near-identical errors unless hidden-state, drop duplicates, sample per domain, write
               case YAML + PNGs, print the paper's Table 6 (counts per stage) and Table 7 (domains)
"""

from __future__ import annotations

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

from pytest_retrace.dataset.casewrite import save_png, screen_digest, write_case
from pytest_retrace.dataset.catalogue import (
    CATALOGUE,
    D_FOR_HORIZON,
    AgentPerturbation,
    Perturbation,
    candidate_probes,
    load_catalogue,
)
from pytest_retrace.dataset.final import print_tables, sample_per_domain
from pytest_retrace.dataset.perturb_agent import PerturbationAgents
from pytest_retrace.dataset.share import share_duplicates
from pytest_retrace.dataset.trajectory import (
    Dropped,
    Trajectory,
    load_scripted,
    read_journal,
    read_jsonl,
    write_jsonl,
)
from pytest_retrace.dataset.verify import Rejected, execute, measured_kind, verify_candidate
from pytest_retrace.envs import EnvError, Environment
from pytest_retrace.replay.casefiles import SHARED_DIR
from pytest_retrace.replay.cases import load_png
from pytest_retrace.replay.judge import judge, reset
from pytest_retrace.replay.probes import narrowest

STAGES = ("rollouts", "consistent", "seeds", "perturb", "final")


@dataclass
class BuildConfig:
    work: Path
    out: Path  # where the final case files go
    scripted: list[Path] = field(default_factory=list)
    osworld: list[Path] = field(default_factory=list)
    osworld_examples: Path | None = None
    osworld_cache: Path | None = None  # OSWorld's cache dir (<task_id>/<file>): files its tasks download
    osworld_settle_quiet: float | None = None  # an imported task's quiet window after each action
    agents: list[str] = field(default_factory=list)  # model configs rolled out on the scripted tasks
    perturb_agents: list[str] = field(default_factory=list)  # model configs making mistakes (besides the catalogue)
    protocol: str = "default"  # "paper": a perturbation agent's look spends a step (dataset/perturb_agent.py)
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


def _job_key(job: tuple[Trajectory, int, Perturbation | AgentPerturbation], protocol: str) -> str:
    traj, t_seed, p = job
    # an agent's budget depends on the protocol: a journal of the other protocol's outcomes is not resumed
    paper = " (paper)" if isinstance(p, AgentPerturbation) and protocol == "paper" else ""
    return f"{traj.id}@{t_seed}:{p.name}{paper}"


class Builder:
    """Runs the stages; replays are spread over one thread per environment (each thread owns one
    desktop exclusively; the work is subprocess and screenshot bound, so threads do run in parallel)."""

    def __init__(self, cfg: BuildConfig, envs: list[Environment], log: Any = print) -> None:
        self.cfg, self.envs, self.log = cfg, envs, log
        self._perturbers = PerturbationAgents(cfg.agent_dirs, cfg.protocol, log)

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

            trajs, drops = import_osworld(root, self.cfg.osworld_examples, cache_dir=self.cfg.osworld_cache,
                                          settle_quiet=self.cfg.osworld_settle_quiet)
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
            reset(env, traj.task, traj.base_dir)
            shots = [env.screenshot()]
            for action in traj.actions:
                execute(env, action)
                shots.append(env.screenshot())
            ev = judge(traj.task, env, traj.base_dir)
            if not ev.passed:
                self.log(f"  {traj.id}: replay {replay + 1} failed the evaluator, dropped: {ev.details}")
                return "inconsistent"
            digests.append([screen_digest(s) for s in shots])
            if replay == 0:
                for i, shot in enumerate(shots):
                    save_png(shot, self.cfg.work / "shots" / traj.id / f"step-{i:03d}.png")
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
        done = read_journal(journal)
        if done:
            self.log(f"[perturb] resuming: {sum(_job_key(j, self.cfg.protocol) in done for j in jobs)} of {len(jobs)} candidates "
                     f"done already ({journal.name})")
        lock = threading.Lock()

        def perturb(env: Environment, job: tuple[Trajectory, int, Perturbation | AgentPerturbation]) -> Any:
            key = _job_key(job, self.cfg.protocol)
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
            self._perturbers.close()
        self._finish("perturb", kept, **dropped)
        journal.unlink(missing_ok=True)

    def _choose(self, rng: random.Random, applicable: list[Perturbation]) -> list[Perturbation]:
        """Per target: one mistake of each intended kind and horizon available, drawn with the fixed seed."""
        groups: dict[tuple[str, str], list[Perturbation]] = defaultdict(list)
        for p in applicable:
            groups[(p.intent, p.horizon)].append(p)
        return [rng.choice(groups[k]) for k in sorted(groups)][: self.cfg.perturbations_per_target]

    def _perturb(self, env: Environment, job: tuple[Trajectory, int, Perturbation | AgentPerturbation]
                 ) -> dict[str, Any] | str:
        traj, t_seed, p = job
        target = load_png(self.cfg.work / "shots" / traj.id / f"step-{t_seed:03d}.png")
        agent: dict[str, Any] = {}
        if isinstance(p, AgentPerturbation):
            try:
                made = self._perturbers.mistake(env, traj, t_seed, target, p)
            except Rejected as exc:
                return exc.reason
            except EnvError as exc:
                self.log(f"  {traj.id}@{t_seed} {p.name}: crash, excluded: {exc}")
                return "crash"
            if isinstance(made, str):
                return made
            actions, mistake, agent = made.actions, made.mistake, {"agent": made.record}
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
        save_png(got.error, err_png)
        self.log(f"  {cid}: {got.kind} (SSIM {got.ssim:.4f}, remaining gt {'succeeds' if got.suffix_passes else 'fails'})")
        return {"id": cid, "trajectory": traj.id, "t_seed": t_seed, "perturbation": p.name, "intent": p.intent,
                "horizon": p.horizon, "d": p.d, "actions": [a.to_dict() for a in actions], "mistake": mistake,
                "kind": got.kind, "ssim": round(got.ssim, 6), "suffix_passes": got.suffix_passes,
                "identical": got.identical, "probes": [q.model_dump(mode="json") for q in probes],
                "error_state": got.error_state,
                "target_digest": screen_digest(target), "error_digest": screen_digest(got.error), "error_png": str(err_png),
                **agent}

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
        chosen, dropped["sampled out"] = sample_per_domain(list(unique.values()), trajs, self.cfg.per_domain,
                                                           self.cfg.seed)
        if self.cfg.out.exists():
            shutil.rmtree(self.cfg.out)
        for cand in chosen:
            write_case(self.cfg.out, self.cfg.work, trajs[cand["trajectory"]], cand)
        # the new form: a file several cases use (a probe script, a page, a screenshot) kept once, in shared/
        shared = share_duplicates(self.cfg.out, log=self.log)
        self.log(f"[final] {len(shared)} case(s) use files kept once in {self.cfg.out / SHARED_DIR}")
        self._finish("final", chosen, **dropped)
        print_tables(self.log, [(st, len(read_jsonl(self.path(st)))) for st in STAGES], trajs, chosen)
        pairs = {(c["target_digest"], c["error_digest"]) for c in chosen}
        self.log(f"\n{len(chosen)} case(s): {len(pairs)} distinct (target, error) screen pairs, "
                 f"{len({c['target_digest'] for c in chosen})} distinct targets; "
                 f"{sum(bool(c['probes']) for c in chosen)} with error-state probes")

    # -- reporting --------------------------------------------------------------------------------
    def _finish(self, stage: str, items: list[dict[str, Any]], **dropped: int) -> None:
        write_jsonl(self.path(stage), items)
        extra = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items()) if v)
        self.log(f"[{stage}] kept {len(items)}" + (f"; excluded {extra}" if extra else ""))
