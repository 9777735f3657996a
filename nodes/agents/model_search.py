"""Search the whole stage-1 catalogue with the calibrated job model (numpy, thousands of configs a round).

An RL step's phases run one after another, so the step time is the rollout side (``gen`` + weight sync)
plus the training side (log-prob passes + update), and the knobs split the same way except a few shared
ones (offloads, ``free_cache_engine``). For every combination of the shared knobs the search evaluates the
full grid of each side, keeps the fastest configs whose predicted peak fits under ``limit - gap``, and
pairs the two sides. The memory share is *solved* (the largest share whose rollout peak fits: it only adds
KV cache) and token caps come from a grid filtered by the same rule, so proposals fill the margin.
Offload and checkpointing are searched as enablers: they cost time but free the memory a larger KV cache
or micro batch can use, which the model prices in.

The ranked list is scored by predicted throughput discounted by (a) the chance the peak crosses the
limit (normal with the model's error) and (b) the model's uncertainty times the distance from the
incumbent (a trust region that widens as the model proves accurate).

``hedges=True`` searches the configs the safety gap alone rules out instead: every training phase fits by the
model's point estimate (the rollout side is solved as always), the peak plus its gap does not. One of them is
worth a slot of a batch (``nodes/agents/rules.py``): the gap is widest where activations were never measured,
and near-copies of the safe picks share their fate, while a hedge measures what the next proposals need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mart.nodes.agents.job_model import KNOBS, ROLLOUT_KNOBS, SHARED_KNOBS, TRAIN_KNOBS, JobModel
from mart.state.agents import split_knob
from mart.state.models import config_hash
from mart.state.objectives import p_over_limit
from mart.state.search_space import ParamSpec, SearchSpace

MNS_GRID = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
MNBT_GRID = (2048, 4096, 8192, 16384, 32768)
CAP_GRID = (1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536)
POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ASYNC_GRID = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def is_hedge(peak_gb: float, gap_gb: float, limit: float) -> bool:
    """A config whose predicted peak fits the limit but not with its safety gap (``search(hedges=True)``)."""
    return limit - gap_gb < peak_gb <= limit


@dataclass
class Scored:
    overrides: dict[str, Any]
    throughput: float
    peak_gb: float
    gap_gb: float
    p_over: float
    value: float
    changed: int
    phase_s: dict[str, float] = field(default_factory=dict)
    phase_gb: dict[str, float] = field(default_factory=dict)


def _grid_values(name: str, spec: ParamSpec, model: JobModel, base_value: Any) -> list[float]:
    lo = spec.low if spec.low is not None else -math.inf
    hi = spec.high if spec.high is not None else math.inf
    if spec.kind == "bool":
        return [0.0, 1.0]
    if spec.kind == "categorical":
        vals = [1.0 if c == "fsdp2" else 0.0 if c == "fsdp" else float(c) for c in (spec.choices or ())
                if not isinstance(c, str) or c in ("fsdp", "fsdp2")]
        if name == "tp":
            vals = [v for v in vals if model.N % v == 0 and v <= model.job.gpus_per_node]
        if name == "sp":
            vals = [v for v in vals if v <= 2]
        return vals or [float(base_value)]
    grid: tuple[int, ...]
    if name == "mns":
        grid = MNS_GRID if not model.cpu else POW2
    elif name == "mnbt":
        grid = MNBT_GRID
    elif name == "tok_cap":
        grid = CAP_GRID
    elif name in ("lp_micro", "ref_micro", "ppo_micro"):
        grid = POW2
    elif name == "async":
        grid = ASYNC_GRID
    else:
        return [float(base_value)]
    vals = sorted({float(v) for v in grid if lo <= v <= hi})
    return vals or [float(base_value)]


def _product(grid: dict[str, list[float]]) -> dict[str, np.ndarray]:
    """Every combination of the knobs' values, one array per knob (itertools.product's order: the last knob
    varies fastest). A mesh, not a list of tuples: the grids run to 10^5 rows, built at every proposal."""
    names = list(grid)
    mesh = np.meshgrid(*(np.asarray(grid[n], dtype=float) for n in names), indexing="ij")
    return {n: m.reshape(-1) for n, m in zip(names, mesh)}


def _value_for_key(spec: ParamSpec | None, name: str, v: float, base_value: Any) -> Any:
    if spec is None:
        return base_value
    if spec.kind == "bool":
        return bool(v > 0.5)
    if name == "fsdp2":
        return "fsdp2" if v > 0.5 else "fsdp"
    if spec.kind == "int" or (spec.kind == "categorical" and isinstance(base_value, int)):
        return int(round(v))
    if spec.kind == "categorical":
        return type(spec.choices[0])(v) if spec.choices else v
    return float(f"{v:.4g}")


def search(model: JobModel, space: SearchSpace, base: dict[str, Any], limit: float, *,
           incumbent: dict[str, Any] | None = None, tried: set[str] | None = None,
           check: Callable[[dict[str, Any]], list[str]] | None = None, n_out: int = 6,
           stage: str = "system", hedges: bool = False) -> list[Scored]:
    """The best configs by risk-adjusted predicted throughput; with ``hedges``, only those the safety gap of the
    training phases rules out, though their point estimate fits (see the module docstring)."""
    incumbent = dict(incumbent or {})
    tried = tried or set()
    full_inc = {**base, **incumbent}
    k_inc = model.knobs(full_inc)
    specs = _model_specs(space, stage)
    w = model.workload(full_inc)
    shared, r_rows, t_rows = _grids(model, specs, k_inc, w)
    if len(t_rows["dyn"]) == 0:
        return []
    sides = _Sides(model=model, specs=specs, k_inc=k_inc, w=w, r_rows=r_rows, t_rows=t_rows, limit=limit,
                   target=limit - model.base_gap_gb(),
                   train_gap=0.0 if hedges else 1.0)  # the share of the training phases' gaps left free
    results: list[tuple[float, dict[str, float], dict[str, float]]] = []
    for s in range(len(shared[SHARED_KNOBS[0]])):
        results += sides.pairs({n: shared[n][s] for n in SHARED_KNOBS})
    # incumbent-anchored half moves (trust region): the incumbent's rollout side with the best training
    # side and vice versa, so a wrong guess on one side cannot spoil a good other side
    results.sort(key=lambda r: r[0])
    top = results[: 120]
    extra = []
    for _, cfg, _ in top[:6]:
        for names in (ROLLOUT_KNOBS, TRAIN_KNOBS):
            mixed = dict(k_inc)
            mixed.update({n: cfg[n] for n in names})
            extra.append(mixed)
    return _score(model, space, base, limit, [c for _, c, _ in top] + extra, incumbent, tried, check, n_out, specs,
                  hedges)


def _grids(model: JobModel, specs: dict[str, ParamSpec], k_inc: dict[str, float], w: Any
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The shared, rollout and training knob grids (each a product of the knobs' values), the training rows
    without the duplicates dynamic batch sizes make and the token caps too small for the longest sequence."""
    def grid_for(names: tuple[str, ...]) -> dict[str, list[float]]:
        out = {}
        for n in names:
            if n in specs and not (n == "util"):
                out[n] = _grid_values(n, specs[n], model, k_inc[n])
            else:
                out[n] = [k_inc[n]]
        return out

    shared = _product(grid_for(SHARED_KNOBS))
    r_grid = grid_for(ROLLOUT_KNOBS)
    t_grid = grid_for(TRAIN_KNOBS)
    if "lp_micro" in specs and "ref_micro" in specs:
        t_grid.pop("ref_micro")  # forward-only passes share one micro batch size (verl's examples do)
    r_rows = _product(r_grid)
    t_rows = _product(t_grid)
    if "ref_micro" not in t_rows:
        t_rows["ref_micro"] = t_rows["lp_micro"].copy()
    # static micro batches are meaningless with dynamic bsz and vice versa: drop the duplicates
    dyn = t_rows["dyn"] > 0
    keep_t = np.where(dyn, (t_rows["ppo_micro"] == t_rows["ppo_micro"].min()) & (t_rows["lp_micro"] == t_rows["lp_micro"].min()),
                      t_rows["tok_cap"] == t_rows["tok_cap"].max() if len(set(t_rows["tok_cap"])) > 1 else True)
    t_rows = {n: v[keep_t] for n, v in t_rows.items()}
    if "tok_cap" in specs:
        ok_cap = (t_rows["dyn"] == 0) | (t_rows["tok_cap"] * t_rows["sp"] >= w.max_len)
        t_rows = {n: v[ok_cap] for n, v in t_rows.items()}
    return shared, r_rows, t_rows


@dataclass
class _Sides:
    """The rollout and training sides of a step, searched apart and paired (see the module docstring)."""

    model: JobModel
    specs: dict[str, ParamSpec]
    k_inc: dict[str, float]
    w: Any
    r_rows: dict[str, np.ndarray]
    t_rows: dict[str, np.ndarray]
    limit: float
    target: float
    train_gap: float

    def pairs(self, sh: dict[str, float]) -> list[tuple[float, dict[str, float], dict[str, float]]]:
        """With the shared knobs ``sh``: the fastest feasible rollout rows paired with the fastest feasible
        training rows, each pair's predicted step time and config."""
        model, specs, limit, w, k_inc = self.model, self.specs, self.limit, self.w, self.k_inc
        nr, nt = len(self.r_rows["tp"]), len(self.t_rows["dyn"])
        # rollout side: solve the memory share, then time and peak
        kr = {**{n: np.full(nr, k_inc[n]) for n in KNOBS}, **self.r_rows, **{n: np.full(nr, v) for n, v in sh.items()}}
        kt = {**{n: np.full(nt, k_inc[n]) for n in KNOBS}, **self.t_rows, **{n: np.full(nt, v) for n, v in sh.items()}}
        kt["util"] = np.zeros(nt)  # the kept KV cache (free_cache_engine off) is added per pair below
        et = model.evaluate(kt, w)
        t_train = et["t"]["old_log_prob"] + et["t"]["ref"] + et["t"]["update_actor"]
        m_train = np.maximum.reduce([et["m"]["old_log_prob"], et["m"]["ref"], et["m"]["update_actor"]])
        ok_t = np.maximum.reduce([np.where(et["m"][p] > 0, et["m"][p] + self.train_gap * et["gap_phase"][p], 0.0)
                                  for p in ("old_log_prob", "ref", "update_actor")]) <= limit
        if not ok_t.any():
            return []
        if "util" in specs and not model.cpu:
            kr["util"] = self._kv_share(kr, sh, float(m_train[ok_t].min()))
        er = model.evaluate(kr, w)
        t_roll = er["t"]["gen"] + er["t"]["other"]
        ok_r = (er["m"]["gen"] + er["gap_phase"]["gen"] <= limit + 1e-9) & ~er["kv_fail"]
        if not ok_r.any():
            return []
        ri = np.flatnonzero(ok_r)[np.argsort(t_roll[ok_r])[:6]]
        ti = np.flatnonzero(ok_t)[np.argsort(t_train[ok_t])[:6]]
        results = []
        for a in ri:
            for b in ti:
                cfg = {n: float(kr[n][a]) for n in ROLLOUT_KNOBS}
                cfg.update({n: float(kt[n][b]) for n in TRAIN_KNOBS})
                cfg.update(sh)
                if sh["free_cache"] < 0.5 and "util" in specs:
                    room = limit - max(float(et["m"][p][b] + self.train_gap * et["gap_phase"][p][b])
                                       for p in ("old_log_prob", "ref", "update_actor"))
                    cfg["util"] = min(cfg["util"], math.floor(room / model.C * 100) / 100)
                    if cfg["util"] < (specs["util"].low or 0.0):
                        continue
                results.append((float(t_roll[a] + t_train[b]), cfg, sh))
        return results

    def _kv_share(self, kr: dict[str, np.ndarray], sh: dict[str, float], m_train_min: float) -> np.ndarray:
        """The rollout's KV-cache share of each row: what the limit leaves the engine, no more than it can fill."""
        model, spec, w = self.model, self.specs["util"], self.w
        kr0 = {**kr, "util": np.zeros(len(kr["tp"]))}
        e0 = model.evaluate(kr0, w)
        util = (self.limit - e0["gap_phase"]["gen"] - e0["m"]["gen"]) / model.C
        # no more KV cache than the engine can fill: a larger share only raises the rollout's peak (and,
        # with the pool kept, the training phases'), and a rollout peak at the limit hides how much the
        # training phases need
        util = np.minimum(util, model.kv_share_needed(kr, w))
        if sh["free_cache"] < 0.5:  # the KV pool stays through training: leave room for the best train config
            util = np.minimum(util, (self.target - m_train_min) / model.C)
        return np.floor(np.clip(util, spec.low, spec.high) * 100) / 100


def agent_copies(space: SearchSpace, key: str) -> list[str]:
    """The catalogue keys of one model knob: the key itself, or every agent's ``agents.<i>.<key>`` in a
    multi-agent job whose agents each carry their own copy (empty when the catalogue has neither)."""
    if key in space:
        return [key]
    return [spec.key for spec in space.params if split_knob(spec.key)[1] == key]


def _model_specs(space: SearchSpace, stage: str) -> dict[str, ParamSpec]:
    specs: dict[str, ParamSpec] = {}
    for name, (key, _) in KNOBS.items():
        keys = agent_copies(space, key)
        if keys and all(space[k].stage == stage for k in keys):
            specs[name] = space[keys[0]]
    return specs


def knobs_to_overrides(space: SearchSpace, base: dict[str, Any], knobs: dict[str, float],
                       specs: dict[str, ParamSpec]) -> dict[str, Any]:
    out = {}
    for name, v in knobs.items():
        if name not in specs:
            continue
        if name in ("lp_micro", "ref_micro", "ppo_micro") and bool(knobs.get("dyn", 0) > 0.5):
            continue  # ignored with dynamic bsz: keep the base value
        if name == "tok_cap" and not bool(knobs.get("dyn", 0) > 0.5):
            continue
        for key in agent_copies(space, KNOBS[name][0]):  # a per-agent system knob moves for every agent
            value = _value_for_key(specs[name], name, v, base.get(key, specs[name].default))
            if base.get(key, specs[name].default) != value:
                out[key] = value
    return out


def _score(model: JobModel, space: SearchSpace, base: dict[str, Any], limit: float, configs: list[dict[str, float]],
           incumbent: dict[str, Any], tried: set[str], check, n_out: int, specs: dict[str, ParamSpec],
           hedges: bool = False) -> list[Scored]:
    seen: set[str] = set()
    scored: list[Scored] = []
    inc_pred = model.predict(incumbent)
    conf = model.confidence()
    for knobs in configs:
        ov = knobs_to_overrides(space, base, knobs, specs)
        full = {**base, **ov}
        h = config_hash(full)
        if h in seen or h in tried:
            continue
        seen.add(h)
        p = model.predict(ov)
        if p.kv_fail:
            continue
        changed = sum(1 for k in set(ov) | set(incumbent) if ov.get(k, base.get(k)) != incumbent.get(k, base.get(k)))
        p_over = p_over_limit(p.peak_gb, p.gap_gb, limit)
        gain = p.throughput / max(inc_pred.throughput, 1e-9) - 1
        value = p.throughput * (1 - 1.5 * p_over) * (1 - (1 - conf) * 0.01 * changed)
        scored.append(Scored(overrides=ov, throughput=p.throughput, peak_gb=p.peak_gb, gap_gb=p.gap_gb,
                             p_over=p_over, value=value, changed=changed, phase_s=p.phase_s, phase_gb=p.phase_gb))
        del gain
    scored.sort(key=lambda s: -s.value)
    out = []
    # a config predicted clearly slower than the incumbent is not worth a trial while faster ones remain
    floor = 0.97 * inc_pred.throughput if any(s.throughput >= 0.97 * inc_pred.throughput for s in scored) else 0.0
    for s in scored:
        fits = is_hedge(s.peak_gb, s.gap_gb, limit) if hedges else s.peak_gb <= limit - s.gap_gb
        if not fits or s.throughput < floor:
            continue
        if check is not None and check(s.overrides):
            continue
        out.append(s)
        if len(out) >= n_out:
            break
    return out
