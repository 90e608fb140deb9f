"""The mistake catalogue (`retrace build`'s scripted perturbations, one YAML file per group of apps) and the
perturbation agent: what drives a target state off track."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from pytest_retrace.actions import Action, parse_action
from pytest_retrace.dataset.trajectory import Trajectory
from pytest_retrace.replay.judge import evaluated_files
from pytest_retrace.replay.probes import Getter, standard_getters

CATALOGUE = Path(__file__).with_name("perturbations")  # one file per group of apps
D_FOR_HORIZON = {"short": 1, "long": 5}
# how many actions a catalogue mistake of each horizon takes: a long-horizon mistake (d = 5) that is over in
# one or two actions would be a short one labelled long
ACTIONS_FOR_HORIZON = {"short": (1, 1), "long": (3, 5)}
INTENTS = ("visible", "hidden-state", "visual-only")
GETTERS: TypeAdapter[Getter] = TypeAdapter(Getter)


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
    try:
        raw_entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the catalogue: {' '.join(str(exc).split())}") from None
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
            probes = tuple(GETTERS.validate_python(g) for g in raw.get("probes") or [])
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


def candidate_probes(traj: Trajectory, p: Perturbation | AgentPerturbation) -> list[Getter]:
    """The getters that may tell a candidate's error state from its target state, most specific first."""
    getters: list[Getter] = [*(getattr(p, "probes", ()) or ()), *(GETTERS.validate_python(g) for g in traj.probes)]
    getters += standard_getters(evaluated_files(traj.task))
    return list(dict.fromkeys(getters))  # once each, in order
