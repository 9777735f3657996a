"""``mart memory CONFIG``: each phase's predicted peak memory of a verl config on named hardware, before a trial.

The model's shape comes from ``--model-config`` (a ``config.json`` or its folder), else from the config's
``actor_rollout_ref.model.path`` when that is a local folder with a ``config.json``, else from the
``config.json`` values mart ships for common models (matched by the path's Hugging Face id). torch and
transformers are imported only inside the command (through the memory probe), so ``mart``'s start stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the verl keys of the job's shape (verl's defaults where a config leaves them out)
DATA, ROLLOUT, MODEL = "data.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."


class MemoryCommandError(ValueError):
    """The command's inputs cannot be used (the message names which)."""


def shipped_models() -> dict[str, Any]:
    from mart.trial_runner.memory_probe import SHIPPED

    return json.loads((SHIPPED.parent / "models.json").read_text())["models"]


def model_config(config: dict[str, Any], model_config_path: Path | None) -> tuple[dict[str, Any], str]:
    """The model's ``config.json`` dict and where it came from."""
    from mart.state.files import read_text_capped

    path = model_config_path
    hf = str(config.get(MODEL + "path") or "")
    if path is None and hf and Path(hf).expanduser().is_dir() and (Path(hf).expanduser() / "config.json").is_file():
        path = Path(hf).expanduser()
    if path is not None:
        p = path / "config.json" if path.is_dir() else path
        try:
            return json.loads(read_text_capped(p, 1 << 20, "model config")), str(p)
        except (OSError, ValueError) as e:
            raise MemoryCommandError(f"cannot read the model config {str(p)!r}: {e}") from None
    for name, entry in shipped_models().items():
        if hf and (hf.rstrip("/").lower() == entry["hf_path"].lower()
                   or hf.rstrip("/").split("/")[-1].lower() == name.lower()):
            return dict(entry["config"]), f"mart's shipped config.json values of {entry['hf_path']}"
    known = ", ".join(e["hf_path"] for e in shipped_models().values())
    raise MemoryCommandError(f"no model config: give --model-config PATH, or set {MODEL}path to a local folder with "
                             f"a config.json or to one of {known}")


def gpu_memory_gb(name: str, memory_gb: float | None) -> float:
    from mart.state.job import gpu_memory

    if memory_gb:
        return memory_gb
    got = gpu_memory(name)
    if got is None:
        raise MemoryCommandError(f"--gpu {name!r}: its memory is not in the GPU table; give --gpu-memory-gb")
    return got


def run(config_file: Path, sets: list[str], gpu: str, nnodes: int, gpus_per_node: int, *,
        model_config_path: Path | None = None, gpu_memory: float | None = None, margin: float = 0.1,
        logits: str = "fused") -> dict[str, Any]:
    from mart.nodes.agents.job_model import JobModel
    from mart.nodes.agents.memory_report import predict_memory
    from mart.state.config_values import ConfigError, load_config_file, parse_assignments
    from mart.state.job import JobDescription, ModelShape, Workload, hardware_from_name

    try:
        config = {**load_config_file(config_file), **parse_assignments(sets)}
    except ConfigError as e:
        raise MemoryCommandError(str(e)) from None
    hf_config, model_source = model_config(config, model_config_path)
    try:
        shape = ModelShape.from_hf_config(hf_config)
    except ValueError as e:
        raise MemoryCommandError(f"model config ({model_source}): {e}") from None

    def num(key: str, default: int) -> int:
        try:
            return int(config.get(key, default))
        except (TypeError, ValueError):
            raise MemoryCommandError(f"{key}: {config.get(key)!r} is not a number") from None

    max_p, max_r = num(DATA + "max_prompt_length", 512), num(DATA + "max_response_length", 512)
    # the worst case: every sequence at its length limit, so the largest micro batch is as large as it can be
    workload = Workload(train_batch_size=num(DATA + "train_batch_size", 1024), rollout_n=num(ROLLOUT + "n", 1),
                        max_prompt_length=max_p, max_response_length=max_r, prompt_length_mean=max_p,
                        response_length_mean=max_r,
                        uses_reference=bool(config.get("actor_rollout_ref.actor.use_kl_loss", False)))
    hardware = hardware_from_name(gpu, gpu_memory_gb(gpu, gpu_memory))
    if logits not in ("fused", "fp32"):
        raise MemoryCommandError(f"--logits must be fused or fp32, got {logits!r}")
    job = JobDescription(model=shape, hardware=hardware, nnodes=nnodes, gpus_per_node=gpus_per_node,
                         workload=workload, logits_path=logits)
    out = predict_memory(JobModel(job, config), config, margin)
    out["model_config"] = model_source
    out["logits"] = logits
    out["gpu"] = gpu
    return out


def render(result: dict[str, Any]) -> str:
    """The human-readable table."""
    from mart.nodes.agents.memory_report import PARTS, PHASE_NAMES
    from mart.state.text import one_line

    lines = [f"model: {one_line(result['model_config'])}   source: {result['source']}"
             + (f" ({one_line(result['why_formula'])})" if result.get("why_formula") else ""),
             f"{'phase':<11}{'peak GiB':>9}  " + "  ".join(f"{p:>15}" for p in PARTS)]
    for phase, row in result["phases"].items():
        lines.append(f"{PHASE_NAMES[phase]:<11}{row['peak_gb']:>9.2f}  "
                     + "  ".join(f"{row['parts'][p]:>15.2f}" for p in PARTS))
    verdict = "fits" if result["fits"] else "does NOT fit"
    lines.append(f"peak {result['peak_gb']:.2f} GiB {verdict} under the margin: limit {result['limit_gb']:.2f} GiB "
                 f"of {result['capacity_gb']:.0f} on {one_line(result['gpu'])}")
    return "\n".join(lines)


__all__ = ["MemoryCommandError", "render", "run"]
