"""One trajectory format for every rollout source (scripted policies, agent runs, OSWorld results).

A trajectory is τ = (task, steps), each step exactly one action; the screenshot before each step is
optional (scripted policies have none until replayed).  Sources that cannot be normalised — a step
with no action, a step with several actions, an unsuccessful run — are dropped with a reason, as the
paper does (appendix A.1), and the reasons are counted by the pipeline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_retrace.actions import Action, ActionError, parse_action
from pytest_retrace.replay.cases import Task


@dataclass
class Step:
    action: Action
    screenshot: str | None = None  # path of the observation before the action, if the source kept it
    rationale: str = ""


@dataclass
class Trajectory:
    id: str
    task: Task
    steps: list[Step]
    source: str  # "scripted:<file>", "agent:<model>", "osworld:<dir>"
    success: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)
    base_dir: Path = Path(".")  # what relative paths in the task (setup src, local_file) resolve against
    probes: list[dict[str, Any]] = field(default_factory=list)  # getters (probes.py) that may see hidden state

    @property
    def actions(self) -> list[Action]:
        return [s.action for s in self.steps]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "source": self.source, "success": self.success, "metadata": self.metadata,
            "base_dir": str(self.base_dir), "task": self.task.model_dump(mode="json"), "probes": self.probes,
            "steps": [{"action": s.action.to_dict(), "screenshot": s.screenshot, "rationale": s.rationale}
                      for s in self.steps],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        return cls(
            id=data["id"], task=Task.model_validate(data["task"]), source=data["source"],
            success=data.get("success", True), metadata=data.get("metadata", {}),
            base_dir=Path(data.get("base_dir", ".")), probes=data.get("probes", []),
            steps=[Step(Action.from_dict(s["action"]), s.get("screenshot"), s.get("rationale", ""))
                   for s in data["steps"]],
        )


@dataclass(frozen=True)
class Dropped:
    """A rollout that did not become a trajectory, and why."""

    source: str
    reason: str


def normalise_steps(raw_steps: list[Any], where: str) -> list[Step] | Dropped:
    """Each raw step must parse to exactly one action (no missing, no multi-action steps)."""
    steps: list[Step] = []
    for i, raw in enumerate(raw_steps):
        rationale, screenshot = "", None
        if isinstance(raw, dict) and "action" in raw and not isinstance(raw["action"], str | dict):
            return Dropped(where, f"step {i}: action is {type(raw['action']).__name__}")
        if isinstance(raw, dict) and "step" in raw:  # {step: <action>, rationale:, screenshot:}
            rationale, screenshot, raw = raw.get("rationale", ""), raw.get("screenshot"), raw["step"]
        if raw in (None, "", []):
            return Dropped(where, f"step {i}: missing action")
        try:
            actions = parse_action(raw)
        except ActionError as exc:
            return Dropped(where, f"step {i}: {exc}")
        if len(actions) != 1:
            return Dropped(where, f"step {i}: {len(actions)} actions in one step")
        steps.append(Step(actions[0], screenshot, rationale))
    return steps


def load_scripted(path: Path) -> Trajectory | Dropped:
    """A scripted forward policy: ``rollouts/<domain>/<name>.yaml`` with ``task`` and ``trajectory``."""
    from pydantic import TypeAdapter

    from pytest_retrace.replay.probes import Getter

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        task = Task.model_validate(raw["task"])
        probes = [TypeAdapter(Getter).validate_python(g).model_dump() for g in raw.get("probes") or []]
    except Exception as exc:  # noqa: BLE001 - any malformed file is one dropped rollout, with its reason
        return Dropped(f"scripted:{path}", f"invalid rollout file: {exc}")
    steps = normalise_steps(raw.get("trajectory") or [], f"scripted:{path}")
    if isinstance(steps, Dropped):
        return steps
    return Trajectory(id=raw.get("id", path.stem), task=task, steps=steps, source=f"scripted:{path}",
                      metadata=raw.get("metadata", {}), base_dir=path.parent, probes=probes)


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in items), encoding="utf-8")
    tmp.replace(path)  # atomic: a stage's output exists only when complete (resumability)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_journal(path: Path) -> dict[str, Any]:
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


def rollout_agent(env: Any, task: Task, agent: Any, base_dir: Path, max_steps: int = 15,
                  shots_dir: Path | None = None) -> Trajectory | Dropped:
    """Roll an agent out on a task through the Agent protocol (the paper's on-policy rollout).

    The agent sees the task instruction and the screen; each of its turns must hold exactly one action
    (multi-action turns are dropped, as in the paper); the run counts only if the evaluator succeeds."""
    from pytest_retrace.agents import AgentContext, AgentTurn, Observation
    from pytest_retrace.replay.judge import judge, reset

    source = f"agent:{agent.name}:{task.id}"
    reset(env, task, base_dir)
    agent.start(AgentContext(instruction=task.instruction, mode="forward", strategy="implicit", budget=max_steps,
                             screen=tuple(env.size)))
    steps: list[Step] = []
    for i in range(max_steps):
        shot = env.screenshot()
        turn: AgentTurn = agent.act(Observation(shot, i, max_steps - len(steps)))
        if turn.invalid is not None:
            return Dropped(source, f"step {i}: invalid reply: {turn.invalid}")
        real = [a for a in turn.actions if not a.terminal]
        if len(real) > 1:
            return Dropped(source, f"step {i}: {len(real)} actions in one step")
        if not real:
            if not turn.actions:
                continue  # the model only looked (a screenshot request)
            break  # done / fail
        shot_path = None
        if shots_dir is not None:
            from PIL import Image

            shots_dir.mkdir(parents=True, exist_ok=True)
            shot_path = str(shots_dir / f"step-{i:03d}.png")
            Image.fromarray(shot).save(shot_path)
        env.execute(real[0])
        steps.append(Step(real[0], shot_path, turn.rationale))
        if len(turn.actions) > 1:  # an action followed by done
            break
    ev = judge(task, env, base_dir)
    if not ev.passed:
        return Dropped(source, f"unsuccessful rollout: {'; '.join(ev.details)}")
    return Trajectory(id=f"{agent.name}-{task.id}", task=task, steps=steps, source=source,
                      base_dir=base_dir)
