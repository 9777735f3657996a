"""Torch's own memory accounting of a model architecture, on the CPU, before any GPU time is spent.

From a model's ``config.json`` values (no weights) the real Hugging Face module is built under fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``: shapes and dtypes, no data), sharded with FSDP2's
``fully_shard`` over a fake process group of the job's FSDP world size
(``torch.testing._internal.distributed.fake_pg``), and one training step (forward, log-prob loss, backward,
AdamW step, with the optimizer state already there as in every step after the first) or one no-grad log-prob
forward is measured by torch's tracker (``torch.distributed._tools.FSDPMemTracker``). Its peak is what
``torch.cuda.max_memory_allocated`` (verl's ``perf/max_memory_allocated_gb``) would report on one rank: no
allocator fragmentation, no CUDA context.

The setup follows verl's FSDP2 actor: fp32 master parameters, bf16 compute (``MixedPrecisionPolicy``: bf16
parameters, fp32 gradient reduction), one FSDP unit per decoder layer (and the input embedding when it is not
tied), non-reentrant gradient checkpointing, a packed micro batch (one row of ``tokens`` tokens, as verl's
``use_remove_padding`` feeds it), attention with flash-attention 2's memory, AdamW with the foreach implementation a GPU uses. The log-prob path is verl's
non-fused one (``logits`` -> fp32 -> ``log_softmax`` -> gather) or, for a fused/flash cross-entropy that never
materialises the logits (``logits="fused"``), the last position's logits only.

A small instance (1 and 2 decoder layers) is measured at two token counts and extrapolated linearly in the
layers to the full depth; within a moment of the step the activations grow in proportion to the tokens
(flash-style attention keeps no tokens^2 term): ``coefficients()`` returns the full-depth peak per phase and
checkpointing as the highest of one line ``a + b x tokens`` per measured moment. Results are
cached per key (in memory and as JSON under ``$MART_CACHE_DIR`` or ``~/.cache/mart``), and measured in a child
process (the fake process group is process-global). torch and transformers are imported only here, only when a
measurement runs (``pip install mart[memory]``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GIB = 1024.0**3
#: config.json fields that shape the memory (others - rope scaling, eps, token ids - do not)
ARCH_FIELDS = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "hidden_act",
               "num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
               "mlp_only_layers", "norm_topk_prob", "attention_bias")
#: architectures whose Hugging Face classes the probe builds (config.json ``model_type``)
SUPPORTED = ("qwen2", "qwen3", "llama", "mistral", "qwen3_moe")
PROBE_TOKENS = (2048, 8192)
PROBE_LAYERS = (1, 2)
VERSION = 2  # bump when the measured setup changes: old cache entries are then ignored


@dataclass(frozen=True)
class Point:
    """One measurement: ``phase`` "update" (a training step) or "logprob" (a no-grad forward)."""

    phase: str
    layers: int
    tokens: int
    ckpt: bool
    logits: str = "fp32"


def arch_of(config: dict[str, Any]) -> dict[str, Any]:
    """The memory-relevant fields of a ``config.json`` dict (text configs nested under ``text_config`` too)."""
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type",
                                                                                     config.get("model_type"))}
    out = {k: config[k] for k in ARCH_FIELDS if config.get(k) is not None}
    if "head_dim" not in out and out.get("hidden_size") and out.get("num_attention_heads"):
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]  # transformers' default: one cache key
    return out


def available(arch: dict[str, Any]) -> str | None:
    """None when the probe can measure ``arch`` here, else why not (the caller falls back to the formula)."""
    if os.environ.get("MART_MEMORY_PROBE", "1") == "0":
        return "disabled by MART_MEMORY_PROBE=0"
    if arch.get("model_type") not in SUPPORTED:
        return f"no config.json model_type the probe builds (one of {', '.join(SUPPORTED)})"
    import importlib.util

    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install 'mart[memory]')"
    return None


# -- the measurement (child process) -----------------------------------------------------------------
def _flash_like_attention():
    """An attention with flash-attention 2's memory (what verl runs): it keeps q, k, v (K/V at the KV heads, not
    repeated), the output and the fp32 log-sum-exp for the backward, which returns dq, dk, dv - no tokens^2
    scores. Under fake tensors only the shapes matter, so the arithmetic is left out; the CPU's own attention
    kernels would materialise the scores."""
    import torch

    class FlashLike(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # (batch, heads, tokens, head_dim)
            out = q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3])
            lse = q.new_empty(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            q.new_empty(q.shape, dtype=torch.float32)  # flash-attn 2's fp32 dq accumulator (a temporary)
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def attention(module, query, key, value, attention_mask, **kwargs):
        return FlashLike.apply(query, key, value), None

    return attention


def _build(arch: dict[str, Any], layers: int):
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM

    AttentionInterface.register("mart_probe_attention", _flash_like_attention())
    fields = {k: v for k, v in arch.items() if k != "model_type"}
    fields["num_hidden_layers"] = layers
    if "mlp_only_layers" in fields:
        fields["mlp_only_layers"] = [i for i in fields["mlp_only_layers"] if i < layers]
    cfg = AutoConfig.for_model(arch["model_type"], **fields)
    return AutoModelForCausalLM.from_config(cfg, dtype="float32", attn_implementation="mart_probe_attention")


def measure(arch: dict[str, Any], world: int, points: list[Point]) -> list[dict[str, float]]:
    """Measure ``points`` in this process (initialises a fake process group of ``world`` ranks)."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    mesh = init_device_mesh("cpu", (world,))
    out = []
    for pt in points:
        with FakeTensorMode():
            model = _build(arch, pt.layers)
            if pt.ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            units = list(model.model.layers)
            if not getattr(model.config, "tie_word_embeddings", False):
                units.append(model.model.embed_tokens)
            for unit in units:
                fully_shard(unit, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            train = pt.phase == "update"
            opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True) if train else None
            ids = torch.randint(0, int(arch["vocab_size"]), (1, pt.tokens))
            pos = torch.arange(pt.tokens).unsqueeze(0)
            keep = 1 if pt.logits == "fused" else 0  # 0 = every position's logits

            def logprob():
                logits = model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep).logits
                if pt.logits == "fused":
                    return logits.float().sum()
                lp = torch.log_softmax(logits.float(), dim=-1)
                return lp.gather(-1, ids[:, -lp.shape[1]:].unsqueeze(-1)).mean()

            if train:
                # a step before the measured one creates the Adam state (it exists in every step after the
                # first), without a forward or backward pass to pay for
                for p in model.parameters():
                    p.grad = torch.zeros_like(p)
                opt.step()
                opt.zero_grad()
            tracker = FSDPMemTracker(model, opt)
            tracker.track_inputs((ids,))
            if train:
                model.train()
                with tracker:
                    logprob().backward()
                    opt.step()
                    opt.zero_grad()
            else:
                model.eval()
                with tracker, torch.no_grad():
                    logprob()
            snap = tracker.get_tracker_snapshot("peak")
        dev = next(d for d in snap if snap[d].get("Total", 0) > 0)
        out.append({str(k).split(".")[-1].lower(): float(v) for k, v in snap[dev].items()})
    return out


# -- cached front end -----------------------------------------------------------------------------
_MEMO: dict[str, dict[str, float]] = {}


def _key(arch: dict[str, Any], world: int, pt: Point) -> str:
    blob = json.dumps({"v": VERSION, "arch": arch, "world": world, **asdict(pt)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _cache_file() -> Path:
    root = Path(os.environ.get("MART_CACHE_DIR") or Path.home() / ".cache" / "mart")
    return root / "memory_probe.json"


#: probe points measured once for common architectures (``scripts/memory_truth.py probe``), shipped with mart
SHIPPED = Path(__file__).resolve().parent / "memory_data" / "probe_cache.json"


def _read_json(path: Path) -> dict[str, dict[str, float]]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _read_cache() -> dict[str, dict[str, float]]:
    return {**_read_json(SHIPPED), **_read_json(_cache_file())}


def export_shipped() -> None:
    """Write every point measured in this process into the shipped cache (the precompute script's last step)."""
    data = {**_read_json(SHIPPED), **_MEMO}
    SHIPPED.write_text(json.dumps({k: {c: int(v) for c, v in r.items()} for k, r in sorted(data.items())},
                                  indent=0) + "\n")


def measure_isolated(arch: dict[str, Any], world: int, points: list[Point],
                     timeout_s: float = 3600.0) -> list[dict[str, float]]:
    """``measure`` in a child process (the fake process group is process-global), uncached."""
    req = json.dumps({"arch": arch_of(arch), "world": world, "points": [asdict(p) for p in points]})
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([sys.executable, "-m", "mart.trial_runner.memory_probe"], input=req, text=True,
                              capture_output=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the memory probe ran past {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the memory probe failed: {tail[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def probe(arch: dict[str, Any], world: int, points: list[Point], timeout_s: float = 600.0) -> list[dict[str, float]]:
    """Each point's peaks in bytes by torch's tracker (keys: ``total`` and its categories), cached per key.

    Raises:
        RuntimeError: the child process failed or timed out (its last lines in the message).
    """
    arch = arch_of(arch)
    keys = [_key(arch, world, pt) for pt in points]
    missing = [pt for pt, k in zip(points, keys) if k not in _MEMO]
    if missing:
        _MEMO.update(_read_cache())
        missing = [pt for pt, k in zip(points, keys) if k not in _MEMO]
    if missing:
        results = measure_isolated(arch, world, missing, timeout_s)
        fresh = {_key(arch, world, pt): r for pt, r in zip(missing, results)}
        _MEMO.update(fresh)
        try:
            path = _cache_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**_read_json(path), **fresh}
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(merged))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: the in-process memo still serves this run
    return [_MEMO[k] for k in keys]


#: torch's tracker categories -> the parts a prediction reports (activations hold the logits too)
PARTS = {"parameters": ("sharded_param", "unsharded_param", "buffer", "all_gather"),
         "gradients": ("sharded_grad", "unsharded_grad", "reduce_scatter"),
         "optimizer_state": ("opt",), "activations": ("act", "temp", "inp")}
#: the categories that grow with the micro batch's tokens (in proportion, at a given moment of the step)
PER_TOKEN = PARTS["activations"]


@dataclass(frozen=True)
class Coefficients:
    """Full-depth per-rank peak (bytes) of each phase for a micro batch of ``tokens``, by checkpointing.

    A step peaks at one of a few moments (the backward's start, where every saved activation and the logits'
    gradients coexist; the LM head's backward with its unsharded gradient; ...), and the moment a small instance
    peaks at is not always the full model's. Each measured token count gives one moment: a line ``a + b x
    tokens`` (``a`` its parameters, gradients and optimizer state, ``b`` its activations and temporaries per
    token), each extrapolated linearly in the layers; the peak is the highest line.
    ``lines[phase][ckpt]`` lists, per moment, ``{part: (a, b)}`` for ``PARTS`` and "total"."""

    lines: dict[str, dict[bool, list[dict[str, tuple[float, float]]]]]
    layers: int
    world: int
    logits: str

    def peak(self, phase: str, ckpt: bool, tokens: Any) -> Any:
        return self.part(phase, ckpt, "total", tokens)

    def part(self, phase: str, ckpt: bool, part: str, tokens: Any) -> Any:
        """``part`` (one of ``PARTS`` or "total") at the peak's moment (numpy arrays of tokens welcome)."""
        return self.parts(phase, ckpt, (part,), tokens)[part]

    def parts(self, phase: str, ckpt: bool, names: tuple[str, ...], tokens: Any) -> dict[str, Any]:
        """Several parts at the peak's moment, the moment found once (the job model asks for two per phase at
        every config it scores)."""
        import numpy as np

        rows = self.lines[phase][bool(ckpt)]
        tok = np.asarray(tokens, dtype=float)
        # the highest line, the first of equals (argmax's rule), found line by line: a few lines, many tokens
        best = rows[0]["total"][0] + rows[0]["total"][1] * tok
        which = np.zeros(tok.shape, dtype=int)
        for i, r in enumerate(rows[1:], 1):
            line = r["total"][0] + r["total"][1] * tok
            higher = line > best
            best, which = np.where(higher, line, best), np.where(higher, i, which)
        out: dict[str, Any] = {}
        for name in names:
            v = rows[0][name][0] + rows[0][name][1] * tok
            for i, r in enumerate(rows[1:], 1):
                v = np.where(which == i, r[name][0] + r[name][1] * tok, v)
            out[name] = float(v) if np.ndim(v) == 0 else v
        return out


def _points(arch: dict[str, Any], logits: str) -> list[Point]:
    return [Point(ph, lay, tok, ck, logits) for ph in ("update", "logprob") for ck in (False, True)
            for lay in PROBE_LAYERS for tok in PROBE_TOKENS]


def is_cached(arch: dict[str, Any], world: int, logits: str = "fp32") -> bool:
    """Whether ``coefficients`` answers without measuring (shipped or cached points)."""
    arch = arch_of(arch)
    if not _MEMO:
        _MEMO.update(_read_cache())
    return all(_key(arch, world, pt) in _MEMO for pt in _points(arch, logits))


def extrapolate(res: dict[Point, dict[str, float]], depth: int, phase: str, ckpt: bool, logits: str = "fp32",
                groups: dict[str, tuple[str, ...]] | None = None) -> list[dict[str, tuple[float, float]]]:
    """One line per measured token count (the moment those instances peaked at, where the 1- and 2-layer ones
    agree on it), extrapolated to ``depth`` layers: per part (``groups``: name -> tracker categories), its static bytes and its per-token bytes (its
    ``PER_TOKEN`` categories / the tokens)."""
    groups = groups or PARTS
    l1, l2 = PROBE_LAYERS
    tok = PROBE_TOKENS[-1]
    r1, r2 = res[Point(phase, l1, tok, ckpt, logits)], res[Point(phase, l2, tok, ckpt, logits)]

    def full(cat: str) -> float:
        return r1.get(cat, 0.0) + (depth - l1) * (r2.get(cat, 0.0) - r1.get(cat, 0.0)) / (l2 - l1)

    line: dict[str, tuple[float, float]] = {}
    for part, cats in groups.items():
        line[part] = (sum(full(c) for c in cats if c not in PER_TOKEN), sum(full(c) for c in cats if c in PER_TOKEN)
                      / tok)
    line["total"] = (sum(a for a, _ in line.values()), sum(b for _, b in line.values()))
    lines = [line]
    if phase == "update":
        # the optimizer step: every fp32 gradient shard (the size of the parameter shard), the Adam state and the
        # foreach implementation's one temporary of the parameters' size. A small instance never peaks there (its
        # logits outweigh it), a large model with checkpointing and short micro batches does
        at_step = {"sharded_param": full("sharded_param"), "sharded_grad": full("sharded_param"),
                   "opt": full("opt") * 1.5}
        opt_line = {part: (sum(at_step.get(c, 0.0) for c in cats), 0.0) for part, cats in groups.items()}
        opt_line["total"] = (sum(a for a, _ in opt_line.values()), 0.0)
        lines.append(opt_line)
    return lines


def coefficients(arch: dict[str, Any], world: int, logits: str = "fp32") -> Coefficients:
    """Measure a 1- and a 2-layer instance at two token counts and extrapolate to the full depth."""
    arch = arch_of(arch)
    depth = int(arch["num_hidden_layers"])
    pts = _points(arch, logits)
    res = dict(zip(pts, probe(arch, world, pts)))
    lines = {ph: {ck: extrapolate(res, depth, ph, ck, logits) for ck in (False, True)} for ph in ("update", "logprob")}
    return Coefficients(lines=lines, layers=depth, world=world, logits=logits)


def _main() -> None:
    req = json.loads(sys.stdin.read())
    pts = [Point(**p) for p in req["points"]]
    print(json.dumps(measure(req["arch"], int(req["world"]), pts)))


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    _main()
