"""Typed search-space parameters and cross-parameter constraints (one catalogue per backend).

A ``ParamSpec`` validates and coerces a single value (errors name the key and the rule); a
``SearchSpace`` validates a whole override mapping, including the cross-parameter ``Constraint``s.
Agent-proposed configs only ever become overrides through ``SearchSpace.validate_overrides``:
unknown keys are refused, so nothing an agent writes reaches a command line unchecked.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

Kind = Literal["int", "float", "log", "categorical", "bool"]
StageName = Literal["system", "learning"]


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
    """

    key: str
    stage: StageName
    kind: Kind
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False

    def __post_init__(self) -> None:
        if self.kind in ("int", "float", "log"):
            if self.low is None or self.high is None or not self.low <= self.high:
                raise ValueError(f"`low <= high` must hold for {self.key}, but got ({self.low=}, {self.high=}).")
            if self.kind == "log" and self.low <= 0:
                raise ValueError(f"`low > 0` must hold for log parameter {self.key}, but got {self.low}.")
        if self.kind == "categorical" and not self.choices:
            raise ValueError(f"categorical parameter {self.key} needs choices.")

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

    def stage_params(self, stage: StageName) -> list[ParamSpec]:
        return [p for p in self.params if p.stage == stage]

    def defaults(self, stage: StageName | None = None) -> dict[str, Any]:
        return {p.key: p.default for p in self.params if stage is None or p.stage == stage}

    def validate_overrides(
        self, overrides: dict[str, Any], *, stage: StageName | None = None
    ) -> dict[str, Any]:
        """Coerce and check each override; unknown keys and keys of another stage are refused."""
        out: dict[str, Any] = {}
        errors: list[str] = []
        for key, value in overrides.items():
            spec = self._by_key.get(key)
            if spec is None:
                errors.append(f"`{key}` is not a tunable knob of the {self.backend} backend.")
                continue
            if stage is not None and spec.stage != stage:
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

    def describe(self, stage: StageName | None = None) -> str:
        """Human/LLM-readable listing of the knobs and constraints (one source of truth for prompts)."""
        lines = []
        for p in self.params:
            if stage and p.stage != stage:
                continue
            rng = f"one of {list(p.choices)}" if p.choices else ("bool" if p.kind == "bool" else f"{p.kind} in [{p.low}, {p.high}]")
            lines.append(f"- {p.key} ({rng}{', nullable' if p.nullable else ''}; default {p.default!r}): {p.description}")
        for c in self.constraints:
            lines.append(f"- constraint {c.name}: {c.description}")
        return "\n".join(lines)
