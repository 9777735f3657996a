"""MARTI's console output -> mart step records (verl-style names), and OOM/crash detection.

What MARTI prints (``marti/trainer/multi_agent_ppotrainer.py`` at ``_flags.MARTI_COMMIT``), through its logger
(``marti/utils/logging_utils.py``: ``LEVEL MM-DD HH:MM:SS file.py:LINE] message``, to stdout), from the trainer
Ray actor (so with Ray's ``(MultiAgent_PPOTrainer pid=N)`` prefix):

* per step, ``[MultiAgent_PPOTrainer] Begin ROLLOUT``, ``... ROLLOUT FINISHED! Begin making experiences``,
  ``... make_experience FINISHED! Begin Training``: the phase boundaries (1 s resolution timestamps); with
  ``dynamic_filtering_for_agents`` a step may sample more than once before training (each rollout's
  generation and experience time is added; ``marti/rollouts_per_step`` counts them);
* per step and trained agent, ``✨ Global step N: {status}``: the dict the agent's actor returned (Python repr:
  ``policy_loss``, ``actor_lr``, ``ppo_clip_ratio``, ``ppo_kl``, ``kl``, ``reward``, ``return``,
  ``response_length``, ``total_length``, ``response_clip_ratio``, ``agent_id``, ``entropy_loss`` with an
  entropy coefficient, ``vllm_kl``...). The line does not name the agent: ``agent_id`` (the mean agent id of its
  experiences) does, else the order of the lines (agent 0 first);
* after an evaluation, ``✨ Evaluation completed, global_step N, eval_metrics: {logs}``: without wandb ``logs``
  is the *last* agent's dict only (``eval_agent<i>_<source>_pass1``, ``..._pass<k>``); with wandb it is every
  agent's, prefixed ``eval/``, plus ``eval_allagent_<source>_pass1``.

A step's record is complete at the next boundary (the next ``Begin ROLLOUT``, a later step's line) or when the
run ends, so each step is returned once, with its evaluation. Names (``agent<i>/...`` per agent, verl's names
for the means over agents): ``policy_loss`` -> ``actor/pg_loss``, ``actor_lr`` -> ``actor/lr``,
``ppo_clip_ratio`` -> ``actor/pg_clipfrac``, ``ppo_kl`` -> ``actor/ppo_kl``, ``kl`` -> ``actor/kl_loss``,
``entropy_loss`` (the masked mean entropy) -> ``actor/entropy``, ``reward`` -> ``critic/rewards/mean``,
``score`` -> ``critic/score/mean`` (``reward`` when no score is logged), ``return`` -> ``critic/returns/mean``,
``response_length`` -> ``response_length/mean``, ``response_clip_ratio`` -> ``response_length/clip_ratio``,
others -> ``agent<i>/marti/<name>``. Phases: ``timing_s/gen``, ``timing_s/make_experience``,
``timing_s/update_actor`` (training and the weight broadcast to vLLM), ``timing_s/step``; throughput:
``perf/total_num_tokens`` = sum over agents of mean ``total_length`` x experiences per agent and step (an
estimate from the config), ``perf/throughput`` = tokens / (step time x the job's GPUs). Evaluation:
``agent<i>/val-core/<source>/pass1``, ``agent<i>/val-aux/<source>/pass<k>``, and the system score
``val-core/<source>/pass1``: MARTI's all-agent mean when printed, else the mean of the agents printed.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

from mart.state.metrics import StepRecord
from mart.trial_runner.metrics import MetricsTail
from mart.trial_runner.verl.logs import classify_exit, find_oom, last_error_line, read_tail, strip_prefixes

__all__ = ["LogContext", "MartiLogParser", "MartiLogTail", "MartiTextTail", "classify_exit", "find_oom",
           "last_error_line", "parse_status_dict", "read_tail"]

_HEADER_RE = re.compile(r"^(?P<level>[A-Z]+) (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d) [^ \]]+:\d+\] (?P<msg>.*)$")
_STEP_RE = re.compile(r"Global step (\d+): (\{.*\})\s*$")
_EVAL_RE = re.compile(r"Evaluation completed(?: in [\d:]+)?, global_step (\d+), eval_metrics: (\{.*\})\s*$")
_PAIR_RE = re.compile(r"'((?:[^'\\]|\\.)*)'\s*:\s*((?:[A-Za-z_.]+\([^()]*\))|[^,{}]+)")
_EVAL_KEY_RE = re.compile(r"^(?:eval/)?eval_(?:agent(?P<agent>\d+)|(?P<all>allagent)|(?P<system>system))_"
                          r"(?P<source>.+)_(?P<metric>pass\d+|passtopk|avg_pass1)$")

#: MARTI status key -> verl name (per agent under ``agent<i>/``; the mean over agents under the bare name)
STATUS_NAMES: dict[str, str] = {
    "policy_loss": "actor/pg_loss",
    "actor_lr": "actor/lr",
    "ppo_clip_ratio": "actor/pg_clipfrac",
    "ppo_kl": "actor/ppo_kl",
    "kl": "actor/kl_loss",
    "entropy_loss": "actor/entropy",
    "reward": "critic/rewards/mean",
    "score": "critic/score/mean",
    "return": "critic/returns/mean",
    "response_length": "response_length/mean",
    "response_clip_ratio": "response_length/clip_ratio",
    "total_length": "marti/total_length",
}


def _number(text: str) -> float:
    text = text.strip()
    m = re.match(r"^(?:np\.|numpy\.|torch\.)?[A-Za-z_][A-Za-z0-9_]*\((.*)\)$", text)
    if m:
        text = m.group(1).split(",")[0].strip()
    if text in ("True", "False"):
        return 1.0 if text == "True" else 0.0
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_status_dict(text: str) -> dict[str, float]:
    """A printed Python dict of numbers (``nan``/``inf``, ``tensor(0.5, ...)`` allowed) -> floats; other values
    (strings, lists) are skipped."""
    out: dict[str, float] = {}
    for m in _PAIR_RE.finditer(text):
        value = m.group(2).strip()
        if value.startswith(("'", '"', "[")):
            continue
        num = _number(value)
        if math.isnan(num) and value.lower() not in ("nan", "none"):
            continue
        out[m.group(1)] = num
    return out


@dataclass
class LogContext:
    """What the parser needs from the trial's config (written by the runner next to the attempt)."""

    gpus: int = 1
    samples_per_agent_step: int = 0
    agent_order: list[int] = field(default_factory=list)

    @classmethod
    def read(cls, path: str | os.PathLike) -> LogContext:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return cls()
        return cls(gpus=int(data.get("gpus") or 1), samples_per_agent_step=int(data.get("samples_per_agent_step") or 0),
                   agent_order=[int(x) for x in data.get("agent_order") or []])

    def write(self, path: str | os.PathLike) -> None:
        from mart.state.files import write_atomic

        write_atomic(Path(path).parent, Path(path).name, json.dumps(
            {"gpus": self.gpus, "samples_per_agent_step": self.samples_per_agent_step, "agent_order": self.agent_order}))


@dataclass
class _Phases:
    """The running step's phase times. With ``dynamic_filtering_for_agents`` a step may take several rollouts
    (MARTI samples again until every agent has enough experiences): each adds its generation and experience time."""

    start: float
    last_begin: float
    gen: float = 0.0
    exp: float = 0.0
    rollouts: int = 1
    last_finish: float | None = None
    train: float | None = None
    end: float | None = None


@dataclass
class _Pending:
    step: int
    agents: dict[int, dict[str, float]] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)
    phases: _Phases | None = None


class MartiLogParser:
    """Feeds on MARTI's log lines, returns finished step records (see the module docstring)."""

    def __init__(self, context: LogContext | None = None, horizon: int | None = None) -> None:
        self.ctx = context or LogContext()
        self.horizon = horizon  # steps past it are dropped (the run is ended there, a step may slip out)
        self._pending: _Pending | None = None
        self._phases: _Phases | None = None  # the running step's phase times (seconds)
        self._closed = True  # a step's status lines came since the last rollout began: the next one starts a step
        self._latest: float | None = None
        self._last_emitted = -1
        self._year = 2000  # MARTI's timestamps carry no year; a leap year accepts 02-29

    def _seconds(self, md: str, hms: str) -> float | None:
        try:
            t = datetime.strptime(f"{self._year}-{md} {hms}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return None
        secs = (t - datetime(2000, 1, 1)).total_seconds()
        if self._latest is not None and secs < self._latest - 180 * 86400:  # the run crossed a new year
            secs += timedelta(days=366).total_seconds()
        self._latest = secs
        return secs

    def feed(self, line: str) -> list[StepRecord]:
        text = strip_prefixes(line).strip()
        m = _HEADER_RE.match(text)
        if not m:
            return []
        msg, when = m.group("msg"), self._seconds(m.group("md"), m.group("hms"))
        out: list[StepRecord] = []
        ph = self._phases
        if "Begin ROLLOUT" in msg:
            out += self.flush()
            if when is None:
                self._phases = None
            elif self._closed or ph is None:
                self._phases, self._closed = _Phases(start=when, last_begin=when), False
            else:  # sampling again for the same step
                if ph.last_finish is not None:
                    ph.exp += when - ph.last_finish
                ph.last_begin, ph.last_finish, ph.rollouts = when, None, ph.rollouts + 1
        elif "ROLLOUT FINISHED" in msg and when is not None and ph is not None:
            ph.gen += when - ph.last_begin
            ph.last_finish = when
        elif "Begin Training" in msg and when is not None and ph is not None:
            if ph.last_finish is not None:
                ph.exp += when - ph.last_finish
                ph.last_finish = None
            ph.train = when
        elif (s := _STEP_RE.search(msg)) is not None:
            step = int(s.group(1))
            if self._pending is not None and self._pending.step != step:
                out += self.flush()
            self._closed = True
            if step <= self._last_emitted:
                return out  # a line echoed again (a re-read log): each step once
            if self._pending is None:
                self._pending = _Pending(step, phases=ph)
            status = parse_status_dict(s.group(2))
            agent = self._agent_of(status, len(self._pending.agents))
            self._pending.agents[agent] = status
            if when is not None and self._pending.phases is not None:
                self._pending.phases.end = when
        elif (e := _EVAL_RE.search(msg)) is not None:
            step = int(e.group(1))
            metrics = parse_status_dict(e.group(2))
            if self._pending is not None and self._pending.step == step:
                self._pending.eval.update(metrics)
            elif step > self._last_emitted:  # an evaluation without training lines (step 0, before training)
                out += self.flush()
                self._pending = _Pending(step, eval=metrics)
                out += self.flush()
        return out

    def _agent_of(self, status: dict[str, float], seen: int) -> int:
        aid = status.get("agent_id")
        if aid is not None and math.isfinite(aid) and abs(aid - round(aid)) < 1e-6:
            return int(round(aid))
        order = self.ctx.agent_order
        return order[seen] if seen < len(order) else seen

    def flush(self) -> list[StepRecord]:
        """The pending step's record (at a boundary, or when the run has ended)."""
        pending, self._pending = self._pending, None
        if pending is None or pending.step <= self._last_emitted:
            return []
        if self.horizon is not None and pending.step > self.horizon:
            return []
        self._last_emitted = pending.step
        return [StepRecord(step=pending.step, data=self._record(pending))]

    def _record(self, p: _Pending) -> dict[str, float]:
        data: dict[str, float] = {}
        if p.agents:
            data["training/global_step"] = float(p.step)
        means: dict[str, list[float]] = {}
        tokens = 0.0
        for i in sorted(p.agents):
            status = p.agents[i]
            if "score" not in status and "reward" in status:
                status = {**status, "score": status["reward"]}
            for key, value in status.items():
                name = STATUS_NAMES.get(key, f"marti/{key}")
                data[f"agent{i}/{name}"] = value
                if key in STATUS_NAMES and not math.isnan(value):
                    means.setdefault(name, []).append(value)
            total = status.get("total_length", math.nan)
            if not math.isnan(total) and self.ctx.samples_per_agent_step:
                tokens += total * self.ctx.samples_per_agent_step
            if "total_length" in status and "response_length" in status:
                data[f"agent{i}/prompt_length/mean"] = status["total_length"] - status["response_length"]
        for name, values in means.items():
            data[name] = sum(values) / len(values)
        ph = p.phases
        if ph is not None and ph.train is not None and ph.end is not None:
            data["timing_s/gen"] = ph.gen
            data["timing_s/make_experience"] = ph.exp
            data["timing_s/update_actor"] = ph.end - ph.train
            data["marti/rollouts_per_step"] = float(ph.rollouts)
            step_s = ph.end - ph.start
            data["timing_s/step"] = step_s
            if tokens > 0:
                data["perf/total_num_tokens"] = tokens
                if step_s > 0:  # 1 s timestamps: a sub-second step has no measurable time
                    data["perf/time_per_step"] = step_s
                    data["perf/throughput"] = tokens / (step_s * max(1, self.ctx.gpus))
        data.update(_eval_names(p.eval))
        return data


def _eval_names(metrics: dict[str, float]) -> dict[str, float]:
    """MARTI's eval keys -> ``val-core/<source>/pass1`` (the system score, first) and per-agent keys."""
    per_agent: dict[str, list[float]] = {}
    system: dict[str, float] = {}
    named: dict[str, float] = {}
    for key, value in metrics.items():
        m = _EVAL_KEY_RE.match(key)
        if not m:
            continue
        source, metric = m.group("source"), m.group("metric")
        group = "val-core" if metric == "pass1" else "val-aux"
        if m.group("agent") is not None:
            named[f"agent{m.group('agent')}/{group}/{source}/{metric}"] = value
            if metric == "pass1":
                per_agent.setdefault(source, []).append(value)
        elif m.group("all") is not None:
            named[f"{group}/{source}/{metric}"] = value
            if metric == "pass1":
                system[source] = value
        else:
            named[f"{group}/system/{source}/{metric}"] = value
    out: dict[str, float] = {}
    for source, values in per_agent.items():
        if source not in system:
            vals = [v for v in values if not math.isnan(v)]
            system[source] = sum(vals) / len(vals) if vals else math.nan
    for source, value in system.items():  # the objective reads the first val-core key: the system score
        out[f"val-core/{source}/pass1"] = value
    out.update({k: v for k, v in named.items() if k not in out})
    return out


class MartiTextTail:
    """Records from a text source read whole each time (a Ray job's log): new complete lines only."""

    def __init__(self, fetch: Callable[[], str], context: LogContext | None = None,
                 horizon: int | None = None) -> None:
        self._fetch = fetch
        self.parser = MartiLogParser(context, horizon)
        self._offset = 0

    def read_new(self, final: bool = False) -> list[StepRecord]:
        try:
            text = self._fetch()
        except Exception:
            return []
        if len(text) < self._offset:  # another log now: start over (the parser still returns each step once)
            self._offset = 0
        end = text.rfind("\n")
        out: list[StepRecord] = []
        if end >= self._offset:
            for line in text[self._offset: end + 1].split("\n"):
                out += self.parser.feed(line)
            self._offset = end + 1
        if final:
            for line in text[self._offset:].split("\n"):
                out += self.parser.feed(line)
            self._offset = len(text)
            out += self.parser.flush()
        return out


class MartiLogTail(MetricsTail):
    """Incremental reader of MARTI's lines in a log file from ``offset`` on (complete lines only); the
    parser is stateful (a step's record is complete at the next step's first line, or at ``final``)."""

    def __init__(self, path: str | os.PathLike, offset: int = 0, context: LogContext | None = None,
                 horizon: int | None = None) -> None:
        super().__init__(path, offset)
        self.parser = MartiLogParser(context, horizon)

    def read_new(self, final: bool = False) -> list[StepRecord]:
        out = [rec for line in self.read_lines(final) for rec in self.parser.feed(line)]
        return out + self.parser.flush() if final else out

