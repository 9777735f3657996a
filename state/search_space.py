"""Typed search-space parameters and cross-parameter constraints (one catalogue per backend).

A ``ParamSpec`` is the one record of a knob: its key, stage, type, range, default and description, and what the
tuner knows about it (``effect``: how it moves a step's time and memory; ``model``: the job model's name for it;
``prior``: the agents' stage-2 move rule; ``move``: how one-knob moves step it; ``aliases``: the words reviewers
use). Every other table of knob facts is derived from these records (docs/architecture.md, "One record per
knob"). It validates and coerces a single value (errors name the key and the rule); a ``SearchSpace``
validates a whole override mapping, including the cross-parameter ``Constraint``s.
Agent-proposed configs only ever become overrides through ``SearchSpace.validate_overrides``:
unknown keys are refused, so nothing an agent writes reaches a command line unchecked.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

from mart.state.stages import KnobStage, traits

Kind = Literal["int", "float", "log", "categorical", "bool"]
Move = Literal["scale", "step", "count"]
#: the agents' stage-2 priors (``mart.nodes.agents.rules``): which rule of thumb moves a learning knob
Prior = Literal["lr", "rollout_n", "entropy", "temperature", "clip_high", "clip_low", "kl"]
PRIORS: tuple[str, ...] = ("lr", "rollout_n", "entropy", "temperature", "clip_high", "clip_low", "kl")


@dataclass(frozen=True)
class KnobEffect:
    """How a knob moves a training step's time and peak memory: the agents' priors where no job model
    predicts it (verl's perf-tuning guide; docs/agents.md).

    Args:
        faster: the direction that speeds its phase up: ``"up"``/``"down"`` for numbers, True/False (on/off)
            for switches; None when it does not speed anything up.
        memory_elasticity: peak memory ~ value ** elasticity (numbers).
        memory_factor_on: the peak memory factor of turning a switch on.
        note: why a move in the ``faster`` direction helps, in a few words (shown in the agents' rationales).
        phase: the step phase it speeds up; None (the default) = the knob's own phase (``ParamSpec.phase``).
        note_against: the same for a move the other way (what it costs or buys); empty: no note, since ``note``
            would say the opposite of what the move does (a smaller micro batch is not "fewer, larger passes").
    """

    faster: Any = None
    memory_elasticity: float = 0.0
    memory_factor_on: float = 1.0
    note: str = ""
    phase: str | None = None
    note_against: str = ""

    def note_for(self, faster: bool | None) -> str:
        """The note of a move: ``note`` toward ``faster`` (or a knob with no known direction), else ``note_against``."""
        return self.note_against if faster is False else self.note


#: the effect of a knob nothing is known about: acts on the whole step, in no known direction
NEUTRAL_EFFECT = KnobEffect(phase="all")
#: a stage whose knobs are selected (its traits say which: ``mart.state.stages.StageTraits.knobs``)
StageSelector = str


class ConfigError(ValueError):
    """A config value or combination is invalid. The message names the key(s) and the rule."""


def display_names(keys: Any) -> dict[str, str]:
    """key -> the name summaries, reports and Slack show: the key's last segment, or, when another of ``keys``
    ends the same way, the shortest dotted suffix that tells them apart (the phase prefix:
    ``rollout.log_prob_micro_batch_size_per_gpu`` beside ``ref.log_prob_micro_batch_size_per_gpu``)."""
    keys = list(dict.fromkeys(keys))
    out: dict[str, str] = {}
    for key in keys:
        parts = key.split(".")
        out[key] = key
        for i in range(len(parts) - 1, 0, -1):
            suffix = ".".join(parts[i:])
            if not any(o != key and (o == suffix or o.endswith("." + suffix)) for o in keys):
                out[key] = suffix
                break
    return out


def _coerce_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"`{key}` must be a bool, but got {value!r}.")


@dataclass(frozen=True)
class ParamSpec:
    """One tunable knob.

    Args:
        key: the verl config key (flat, dotted).
        stage: ``system`` (stage 1, throughput) or ``learning`` (stage 2, score).
        kind: ``int``, ``float``, ``log`` (float sampled on a log scale), ``categorical`` or ``bool``.
        low, high: inclusive range for numeric kinds.
        choices: allowed values for ``categorical``.
        default: the backend's default value (the baseline).
        description: what the knob does, shown to agents and reviewers.
        nullable: ``None`` is allowed (verl's ``null`` defaults).
        effect: how it moves a step's time and memory (None: nothing known, ``NEUTRAL_EFFECT``).
        model: the name the job model reads it under (``mart.nodes.agents.job_model.KNOBS``: ``util``,
            ``ppo_micro``, ...); None when the job model does not model it.
        prior: the agents' stage-2 rule of thumb for it (one of ``PRIORS``: ``lr``, ``kl``, ...); None: a
            neutral prior.
        move: how the agents' one-knob moves step it: ``scale`` (x2, /2), ``step`` (+-(high - low)/5) or
            ``count`` (+-1); None: by its kind (see ``mart.nodes.agents.rules``).
        zero_start: the value a move up from 0 tries (0 meaning "off", where doubling would stay at 0).
        aliases: what people call it in free-text feedback, beside the names read off its key.
        means: the verl key of the knob this one is under another backend's name (MARTI's
            ``actor_learning_rate`` means ``actor_rollout_ref.actor.optim.lr``): the facts it leaves unset are
            that knob's (``mart.nodes.knob_effects.knob_facts``; a verl key, or a per-agent copy of one,
            means itself).
        schedule: a system knob the schedule stage (stage 3) may move too, because a capacity change of a
            segment implies it (a token cap that must hold the longest sequence once the response limit grows).
        memory_safe: a system knob whose smaller value only lowers a phase's memory and changes no update's math
            (a micro batch: gradients accumulate to the same mini batch). Stage 3 may lower it, never raise it,
            when a segment's transition is projected to outgrow the memory limit before the schedule's end.
        phases: every step phase the knob's value can move (its time), when that is more than its own ``phase``
            (``use_dynamic_bsz`` packs the log-prob passes too); empty: its ``phase`` alone. Stage 1 judges a
            trial on these (``acts_on``): a phase none of its changed knobs acts on that moved beyond its noise
            marks the measurement disturbed (``mart.state.objectives.disturbed_phases``).
    """

    key: str
    stage: KnobStage
    kind: Kind
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False
    effect: KnobEffect | None = None
    model: str | None = None
    prior: Prior | None = None
    move: Move | None = None
    zero_start: float | None = None
    aliases: tuple[str, ...] = ()
    means: str | None = None
    schedule: bool = False
    memory_safe: bool = False
    phases: tuple[str, ...] = ()

    def in_stage(self, stage: StageSelector) -> bool:
        """Whether a stage's candidates may change this knob (its traits: the catalogues, and the flagged knobs)."""
        t = traits(stage)
        return self.stage in t.knobs or (t.flagged_knobs and (self.schedule or self.memory_safe))

    def __post_init__(self) -> None:
        if self.kind in ("int", "float", "log"):
            if self.low is None or self.high is None or not self.low <= self.high:
                raise ValueError(f"`low <= high` must hold for {self.key}, but got ({self.low=}, {self.high=}).")
            if self.kind == "log" and self.low <= 0:
                raise ValueError(f"`low > 0` must hold for log parameter {self.key}, but got {self.low}.")
        if self.kind == "categorical" and not self.choices:
            raise ValueError(f"categorical parameter {self.key} needs choices.")
        if self.prior is not None and self.prior not in PRIORS:
            raise ValueError(f"`prior` of {self.key} must be one of {list(PRIORS)}, but got {self.prior!r}.")
        if self.effect is not None and self.effect.phase is None:  # the phase is the knob's own unless it says
            object.__setattr__(self, "effect", replace(self.effect, phase=self.phase))

    @property
    def known_effect(self) -> KnobEffect:
        """Its effect, or the neutral one when nothing is known about it."""
        return self.effect or NEUTRAL_EFFECT

    def validate(self, value: Any) -> Any:
        """Return ``value`` coerced to this knob's type, or raise ``ConfigError`` naming the rule."""
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            if self.nullable:
                return None
            raise ConfigError(f"`{self.key}` may not be null.")
        if self.kind == "bool":
            return _coerce_bool(self.key, value)
        if self.kind == "categorical":
            assert self.choices is not None
            for choice in self.choices:
                if value == choice or str(value) == str(choice):
                    return choice
            raise ConfigError(f"`{self.key}` must be one of {list(self.choices)}, but got {value!r}.")
        if isinstance(value, bool):
            raise ConfigError(f"`{self.key}` must be a number, but got the bool {value!r}.")
        try:
            num = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"`{self.key}` must be a number, but got {value!r}.") from None
        if not math.isfinite(num):
            raise ConfigError(f"`{self.key}` must be finite, but got {value!r}.")
        if self.kind == "int":
            if num != int(num):
                raise ConfigError(f"`{self.key}` must be an integer, but got {value!r}.")
            num = int(num)
        assert self.low is not None and self.high is not None
        if not self.low <= num <= self.high:
            raise ConfigError(f"`{self.key}` must lie in [{self.low}, {self.high}], but got {value!r}.")
        return num

    @property
    def short(self) -> str:
        """The name a person types: the key's last segment without verl's filler (``micro_batch``); a
        per-agent key ``agents.<i>.…`` is ``agent<i>.<that>`` (``agents.0.actor.optim.lr`` -> ``agent0.lr``)."""
        last = self.key.rsplit(".", 1)[-1]
        last = re.sub(r"^(ppo_|enable_|use_)", "", last)
        last = re.sub(r"(_size)?(_per_gpu)?$", "", last) or last
        agent = re.match(r"^agents\.(\d+)\.", self.key)
        return f"agent{agent.group(1)}.{last}" if agent else last

    @property
    def phase(self) -> str:
        """The step phase the knob acts on (learning knobs: ``learning``), read from where verl keeps it."""
        if self.stage == "learning":
            return "learning"
        k = self.key
        if ".rollout.log_prob" in k:
            return "old_log_prob"
        for part, phase in ((".rollout.", "gen"), (".ref.", "ref"), (".actor.", "update_actor"),
                            (".model.", "update_actor")):
            if part in k:
                return phase
        return "all"

    @property
    def acts_on(self) -> tuple[str, ...]:
        """The step phases whose time the knob can move: ``phases`` when given, else its ``phase`` (``("all",)``:
        every phase, e.g. a learning knob that changes the workload)."""
        if self.phases:
            return self.phases
        return ("all",) if self.phase in ("all", "learning") else (self.phase,)

    def range_text(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        if self.kind == "bool":
            return "true/false"
        return f"{self.kind} in [{self.low:g}, {self.high:g}]"

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("key", "stage", "kind", "default", "description", "low", "high")}
        d["choices"] = list(self.choices) if self.choices else None
        d["nullable"] = self.nullable
        if self.effect is not None:
            d["effect"] = {k: getattr(self.effect, k) for k in ("phase", "faster", "memory_elasticity",
                                                                "memory_factor_on", "note")}
        for k in ("model", "prior", "move", "zero_start", "means"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.phases:
            d["phases"] = list(self.phases)
        if self.aliases:
            d["aliases"] = list(self.aliases)
        return d


@dataclass(frozen=True)
class Constraint:
    """A cross-parameter rule. ``check(config)`` returns an error message, or None when it holds."""

    name: str
    description: str
    check: Callable[[dict[str, Any]], str | None]


@dataclass
class SearchSpace:
    """A backend's catalogue of knobs plus its cross-parameter constraints."""

    backend: str
    params: list[ParamSpec]
    constraints: list[Constraint] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_key = {p.key: p for p in self.params}
        if len(self._by_key) != len(self.params):
            raise ValueError(f"duplicate keys in the {self.backend} search space")

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __getitem__(self, key: str) -> ParamSpec:
        return self._by_key[key]

    def short_names(self) -> dict[str, str]:
        """key -> short name, for the short names that belong to exactly one knob."""
        counts: dict[str, int] = {}
        for p in self.params:
            counts[p.short] = counts.get(p.short, 0) + 1
        return {p.key: p.short for p in self.params if counts[p.short] == 1}

    def edit_name(self, key: str) -> str:
        """The shortest name ``resolve_key`` maps to ``key``: its short name, else its shortest unique suffix."""
        short = self.short_names().get(key)
        if short:
            return short
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            suffix = ".".join(parts[i:])
            if [k for k in self._by_key if k.endswith("." + suffix)] == [key]:
                return suffix
        return key

    def resolve_key(self, name: str) -> str:
        """The full key a person meant: the key itself, a unique dotted suffix, or a unique short name.

        Raises ConfigError naming the closest knobs when ``name`` is unknown or ambiguous.
        """
        name = name.strip().lstrip("+")
        if name in self._by_key:
            return name
        by_suffix = [k for k in self._by_key if k.endswith("." + name)]
        if len(by_suffix) == 1:
            return by_suffix[0]
        by_short = [k for k, s in self.short_names().items() if s == name]
        if len(by_short) == 1:
            return by_short[0]
        same_short = [p.key for p in self.params if p.short == name]
        if len(by_suffix) > 1 or len(same_short) > 1:
            raise ConfigError(f"`{name}` is ambiguous in the {self.backend} backend: it may be "
                              + " or ".join(f"`{k}`" for k in sorted(by_suffix or same_short)) + ".")
        names = list(self._by_key) + list(self.short_names().values())
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        close += [k for k in self._by_key if name in k and k not in close][: 3 - len(close)]
        hint = (" Closest: " + ", ".join(f"`{c}`" for c in close) + ".") if close else ""
        raise ConfigError(f"`{name}` is not a tunable knob of the {self.backend} backend.{hint}")

    def resolve_keys(self, edits: dict[str, Any]) -> dict[str, Any]:
        """``edits`` with every key resolved by ``resolve_key`` (errors for all bad keys at once)."""
        out, errors = {}, []
        for name, value in edits.items():
            try:
                out[self.resolve_key(name)] = value
            except ConfigError as e:
                errors.append(str(e))
        if errors:
            raise ConfigError(" ".join(errors))
        return out

    def stage_params(self, stage: StageSelector) -> list[ParamSpec]:
        return [p for p in self.params if p.in_stage(stage)]

    def defaults(self, stage: StageSelector | None = None) -> dict[str, Any]:
        return {p.key: p.default for p in self.params if stage is None or p.in_stage(stage)}

    def validate_overrides(
        self, overrides: dict[str, Any], *, stage: StageSelector | None = None
    ) -> dict[str, Any]:
        """Coerce and check each override; unknown keys and keys of another stage are refused."""
        out: dict[str, Any] = {}
        errors: list[str] = []
        for key, value in overrides.items():
            spec = self._by_key.get(key)
            if spec is None:
                errors.append(f"`{key}` is not a tunable knob of the {self.backend} backend.")
                continue
            if stage is not None and not spec.in_stage(stage):
                errors.append(f"`{key}` is a {spec.stage}-stage knob; it cannot change in the {stage} stage.")
                continue
            try:
                out[key] = spec.validate(value)
            except ConfigError as e:
                errors.append(str(e))
        if errors:
            raise ConfigError(" ".join(errors))
        return out

    def check_constraints(self, config: dict[str, Any]) -> list[str]:
        """Messages of every constraint the full ``config`` breaks (empty when all hold)."""
        msgs = []
        for c in self.constraints:
            msg = c.check(config)
            if msg:
                msgs.append(f"{c.name}: {msg}")
        return msgs

    def describe(self, stage: StageSelector | None = None) -> str:
        """Human/LLM-readable listing of the knobs and constraints (one source of truth for prompts)."""
        lines = []
        for p in self.params:
            if stage and not p.in_stage(stage):
                continue
            rng = f"one of {list(p.choices)}" if p.choices else ("bool" if p.kind == "bool" else f"{p.kind} in [{p.low}, {p.high}]")
            lines.append(f"- {p.key} ({rng}{', nullable' if p.nullable else ''}; default {p.default!r}): {p.description}")
        for c in self.constraints:
            lines.append(f"- constraint {c.name}: {c.description}")
        return "\n".join(lines)
