"""Cluster scenarios of the simulator, read from YAML: the shipped ones and a user's files.

A scenario (the types: ``job``) is a user's job described in YAML (``name``, ``model``, ``cluster``, ``workload``, optional
``learning`` and ``base_config``), validated with pydantic so that a bad file gets an error naming the
field. The shipped scenarios are such files inside the package (``trial_runner/sim/scenarios/*.yaml``).
``load_scenario(spec)`` takes a shipped name, a path to a YAML file, or a ``Scenario``; ``perturb=SEED``
redraws the simulator's hidden constants (``SimConstants``) within documented ranges, so a tuner cannot
win by sharing the simulator's formulas. A file with a ``multi_agent:`` section is a MARTI-style job
(``MultiAgentScenario``); a user's file is also checked against verl's rules (``catalogue``). Every number is documented, with its public source, in
``docs/sim.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mart.state.files import InputFileError, read_text_capped
from mart.state.search_space import ConfigError
from mart.trial_runner.sim.catalogue import base_config, search_space
from mart.trial_runner.sim.job import (
    GPU,
    GPUS,
    PERTURB_RANGES,
    LearningProfile,
    ModelSpec,
    MultiAgentScenario,
    Scenario,
    SimConstants,
    perturbed_constants,
)


# ------------------------------------------------------------------------------------ YAML schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelFile(_Strict):
    """``model:`` - the Hugging Face ``config.json`` fields the simulator needs, plus the parameter count."""

    name: str = Field(min_length=1)
    hf_path: str | None = None
    num_hidden_layers: int = Field(ge=1, le=512)
    hidden_size: int = Field(ge=64, le=1 << 17)
    intermediate_size: int = Field(ge=64, le=1 << 19)
    num_attention_heads: int = Field(ge=1, le=1024)
    num_key_value_heads: int = Field(ge=1, le=1024)
    vocab_size: int = Field(ge=256, le=1 << 22)
    num_parameters: float = Field(gt=1e7, le=2e12, description="total parameters, embeddings included (e.g. 8.03e9)")
    head_dim: int | None = Field(default=None, ge=16, le=4096)
    model_type: str | None = Field(default=None, description="config.json's model_type (qwen3, qwen2, llama, "
                                   "qwen3_moe): lets the tuner's memory probe build the real module")
    tie_word_embeddings: bool = False
    num_experts: int | None = Field(default=None, ge=2, le=4096, description="MoE: routed experts per layer")
    num_experts_per_tok: int | None = Field(default=None, ge=1, le=256, description="MoE: experts per token")
    moe_intermediate_size: int | None = Field(default=None, ge=16, le=1 << 19, description="MoE: one expert's FFN")

    @model_validator(mode="after")
    def _heads(self) -> ModelFile:
        moe = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size)
        if any(v is not None for v in moe) and any(v is None for v in moe):
            raise ValueError("an MoE model gives num_experts, num_experts_per_tok and moe_intermediate_size")
        if self.num_experts and self.num_experts_per_tok > self.num_experts:
            raise ValueError("num_experts_per_tok exceeds num_experts")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads (or give head_dim)")
        return self


class ClusterFile(_Strict):
    """``cluster:`` - a GPU from the table (``GPUS``), the node count and GPUs per node."""

    gpu: str
    nodes: int = Field(default=1, ge=1, le=256)
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    memory_gb: float | None = Field(default=None, gt=4, description="override the table's GPU memory")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        if gpu not in GPUS:
            raise ValueError(f"{gpu!r} is not in the GPU table: use one of {sorted(GPUS)}")
        return gpu


class WorkloadFile(_Strict):
    """``workload:`` - the job's batch shape and response lengths."""

    # upper bounds: far above any real GRPO job, low enough that a simulated trial always ends
    train_batch_size: int = Field(ge=1, le=1 << 20)
    rollout_n: int = Field(ge=2, le=1024, description="GRPO needs a group of >= 2 samples per prompt")
    max_prompt_length: int = Field(ge=16, le=1 << 20)
    max_response_length: int = Field(ge=16, le=1 << 20)
    mean_response_length: float = Field(gt=0)
    mean_prompt_length: float | None = Field(default=None, gt=0)
    response_length_cv: float = Field(default=0.7, gt=0.05, le=3.0)
    val_size: int = Field(default=775, ge=1, le=1_000_000)
    test_freq: int = Field(default=5, ge=-1, le=1_000_000)

    @model_validator(mode="after")
    def _lengths(self) -> WorkloadFile:
        if self.mean_response_length >= self.max_response_length:
            raise ValueError("mean_response_length must be below max_response_length")
        if self.mean_prompt_length is not None and self.mean_prompt_length > self.max_prompt_length:
            raise ValueError("mean_prompt_length must not exceed max_prompt_length")
        return self


class LearningFile(_Strict):
    """``learning:`` (optional) - the learning curve; defaults scale with the model size (docs/sim.md)."""

    score0: float | None = Field(default=None, ge=0, le=1)
    headroom: float | None = Field(default=None, ge=0, le=1)
    lr_opt: float | None = Field(default=None, gt=0, le=1e-3)
    entropy0: float | None = Field(default=None, gt=0, le=12)
    reward0: float | None = Field(default=None, ge=0, le=1)
    resp_growth: float | None = Field(default=None, ge=-0.9, le=10)
    tau_steps: float | None = Field(default=None, gt=0, le=1e6)


class VersionsFile(_Strict):
    """``versions:`` - the verl and vLLM releases whose defaults and rules the job runs under."""

    verl: str = Field(default="0.9.1", pattern=r"^\d+\.\d+(\.\d+)?([.a-z0-9+-]*)$")
    vllm: str = Field(default="0.11.0", pattern=r"^\d+\.\d+(\.\d+)?([.a-z0-9+-]*)$")


class ScenarioFile(_Strict):
    """A scenario file: a verl GRPO job on a cluster, as a user describes it."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    model: ModelFile
    cluster: ClusterFile
    workload: WorkloadFile
    learning: LearningFile = LearningFile()
    base_config: dict[str, Any] = Field(default_factory=dict)
    rollout_engine: Literal["vllm-v1", "vllm-v0"] = Field(
        default="vllm-v1", description="vLLM engine generation (vllm-v0 for runs before 2025)")
    versions: VersionsFile = Field(default_factory=lambda: VersionsFile())

    @field_validator("base_config")
    @classmethod
    def _base_config(cls, base: dict[str, Any]) -> dict[str, Any]:
        catalogue = search_space()  # verl's
        out = {}
        for key, value in base.items():
            if not isinstance(key, str) or not key or " " in key:
                raise ValueError(f"key {key!r} must be a dotted verl key")
            if key in catalogue:
                try:
                    value = catalogue[key].validate(value)  # catalogue knobs: the catalogue's rule
                except ConfigError as e:
                    raise ValueError(str(e)) from None
            out[key] = value
        return out


def _learning_defaults(params: float) -> dict[str, float]:
    """Learning profile by model size: the 8B's for >= 3B params, the 0.6B-Base's below (docs/sim.md)."""
    big = params >= 3e9
    lr_opt = float(np.clip(4e-6 * (8.19e9 / params) ** 0.15, 2e-6, 8e-6))
    return {
        "score0": 0.42 if big else 0.105,
        "headroom": 0.10 if big else 0.03,
        "lr_opt": lr_opt,
        "tau_steps": 40.0,
        "entropy0": 0.45 if big else 0.85,
        "reward0": 0.46 if big else 0.17,
        # a reasoning model's responses lengthen modestly (DeepScaleR's 8K stage: clip ratio 4.2% -> 6.5%); a base
        # model's several-fold (DAPO, arXiv 2503.14476: Qwen2.5-32B base ~1k -> 4k+ tokens over its run)
        "resp_growth": 0.35 if big else 3.0,
    }


def scenario_from_file(data: ScenarioFile) -> Scenario:
    """The simulator's ``Scenario`` for a validated scenario file."""
    mf, cf, wf = data.model, data.cluster, data.workload
    head_dim = mf.head_dim or mf.hidden_size // mf.num_attention_heads
    model = ModelSpec(name=mf.name, hf_path=mf.hf_path or mf.name, params=float(mf.num_parameters),
                      layers=mf.num_hidden_layers, hidden=mf.hidden_size, intermediate=mf.intermediate_size,
                      kv_heads=mf.num_key_value_heads, head_dim=head_dim, vocab=mf.vocab_size,
                      heads=mf.num_attention_heads, model_type=mf.model_type or "",
                      tie_word_embeddings=mf.tie_word_embeddings, experts=mf.num_experts or 0,
                      experts_per_tok=mf.num_experts_per_tok or 0, moe_intermediate=mf.moe_intermediate_size or 0)
    gpu = GPUS[cf.gpu]
    if cf.memory_gb is not None:
        gpu = replace(gpu, memory_gb=float(cf.memory_gb))
    lp = _learning_defaults(model.params)
    lp.update({k: v for k, v in data.learning.model_dump().items() if v is not None})
    learning = LearningProfile(resp_len0=float(wf.mean_response_length), resp_cv=float(wf.response_length_cv), **lp)
    prompt_mean = wf.mean_prompt_length if wf.mean_prompt_length is not None else min(250.0, wf.max_prompt_length / 4)
    return Scenario(
        name=data.name, model=model, gpu=gpu, nnodes=cf.nodes, gpus_per_node=cf.gpus_per_node,
        train_batch_size=wf.train_batch_size, rollout_n=wf.rollout_n, max_prompt_length=wf.max_prompt_length,
        max_response_length=wf.max_response_length, prompt_len_mean=float(prompt_mean), learning=learning,
        val_size=wf.val_size, test_freq=wf.test_freq,
        description=data.description or f"{model.hf_path} GRPO, {cf.nodes}x{cf.gpus_per_node} {gpu.name}",
        base_overrides=tuple(sorted(data.base_config.items(), key=lambda kv: kv[0])),
        rollout_engine=data.rollout_engine, verl_version=data.versions.verl, vllm_version=data.versions.vllm,
    )


class MultiAgentFile(BaseModel):
    """``multi_agent:`` - the workflow, its agents and where they run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_agents: int = Field(ge=2, le=8)
    workflow: Literal["debate", "chain"] = "debate"
    num_rounds: int = Field(default=2, ge=1, le=4)
    max_others: int = Field(default=5, ge=1)
    contain_self: bool = True
    placement: Literal["own", "shared"] = "own"
    debate_gain0: float = Field(default=0.02, ge=0, le=0.5)
    debate_gain_trained: float = Field(default=0.06, ge=0, le=0.5)

    @model_validator(mode="after")
    def _chain(self) -> MultiAgentFile:
        if self.workflow == "chain" and self.num_rounds != 1:
            raise ValueError("a chain passes through its agents once: num_rounds must be 1")
        return self


class MultiAgentScenarioFile(ScenarioFile):
    multi_agent: MultiAgentFile


def scenario_from_data(raw: dict[str, Any]) -> MultiAgentScenario:
    """A ``MultiAgentScenario`` from parsed YAML (raises pydantic's ``ValidationError``)."""
    data = MultiAgentScenarioFile.model_validate(raw)
    base = scenario_from_file(ScenarioFile.model_validate({k: v for k, v in raw.items() if k != "multi_agent"}))
    ma = data.multi_agent
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Scenario)}
    return MultiAgentScenario(**fields, num_agents=ma.num_agents, workflow=ma.workflow, num_rounds=ma.num_rounds,
                              max_others=ma.max_others, contain_self=ma.contain_self, placement=ma.placement,
                              debate_gain0=ma.debate_gain0, debate_gain_trained=ma.debate_gain_trained)



class ScenarioError(ValueError):
    """A scenario file or name is invalid; the message names the file and the field."""


def _format_validation(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {where}: {e['msg']}")
    return f"invalid scenario file {source}:\n" + "\n".join(lines)


def parse_scenario(text: str, source: str = "<scenario>", check_baseline: bool = True) -> Scenario:
    """A ``Scenario`` from YAML text. Raises ``ScenarioError`` naming the field and the rule.

    ``check_baseline`` also checks the job's baseline config against verl's rules (the shipped files,
    read while the simulator's modules load, are checked by the tests instead).
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"invalid scenario file {source}: not YAML ({e})") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"invalid scenario file {source}: expected a mapping with name, model, cluster, workload")
    try:
        if "multi_agent" in raw:  # a MARTI-style multi-agent job (docs/sim.md, "Multi-agent scenarios")
            sc = scenario_from_data(raw)
        else:
            sc = scenario_from_file(ScenarioFile.model_validate(raw))
    except ValidationError as e:
        raise ScenarioError(_format_validation(source, e)) from None
    if not check_baseline:
        return sc
    errors = search_space(sc).check_constraints(base_config(sc))
    if errors:  # verl would refuse the job's own baseline: say so now, not at the first trial
        raise ScenarioError(f"invalid scenario file {source}:\n  base_config: the job's baseline breaks verl's rules: "
                            + " ".join(errors))
    return sc


SHIPPED_DIR = "scenarios"
#: a scenario file is a few KB: a larger one, or one that is not a regular file, is refused unread
MAX_SCENARIO_BYTES = 1 << 20


@lru_cache(maxsize=4)
def _shipped(sub: str = "") -> dict[str, Scenario]:
    out: dict[str, Scenario] = {}
    folder = resources.files("mart.trial_runner.sim") / SHIPPED_DIR
    if sub:
        folder = folder / sub
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".yaml"):
            sc = parse_scenario(item.read_text(), f"{SHIPPED_DIR}/{sub + '/' if sub else ''}{item.name}", False)
            out[sc.name] = sc
    return out


#: The four MART scenarios (Qwen3 on H100s), read once at import from the package's YAML files.
SCENARIOS: dict[str, Scenario] = _shipped()
#: Jobs with public step timings, used to calibrate the simulator (docs/sim.md, "Public facts").
CALIBRATION: dict[str, Scenario] = _shipped("calibration")
#: Jobs with public step times the simulator was never calibrated on: held-out checks (docs/sim.md, "Step time
#: against public points it was not calibrated on"); a recalibration must not fit them.
CHECKS: dict[str, Scenario] = _shipped("checks")
#: Multi-agent jobs (MARTI-style workflows of several trained agents; docs/sim.md, "Multi-agent scenarios").
MULTI_AGENT: dict[str, Scenario] = _shipped("multi-agent")


def get_scenario(name: str) -> Scenario:
    """The shipped scenario ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    for table in (SCENARIOS, CALIBRATION, CHECKS, MULTI_AGENT):
        if name in table:
            return table[name]
    raise ValueError(f"unknown sim scenario {name!r}: use one of {sorted(SCENARIOS) + sorted(MULTI_AGENT)} "
                     "or a scenario file (scenario_file=PATH)")


def load_scenario(spec: str | Path | Scenario, perturb: int | None = None) -> Scenario:
    """A scenario from a shipped name, a path to a YAML scenario file, or a ``Scenario``.

    Args:
        perturb: redraw the hidden constants from this seed (``None``: keep the spec's own).

    Raises:
        ScenarioError / ValueError: unknown name, unreadable file, or a file failing validation (names the field).
    """
    if isinstance(spec, Scenario):
        sc = spec
    else:
        text = str(spec)
        path = Path(text).expanduser()
        if text in SCENARIOS or text in CALIBRATION or text in CHECKS or text in MULTI_AGENT:
            sc = get_scenario(text)
        elif text.endswith((".yaml", ".yml")) or path.exists():
            try:
                content = read_text_capped(path, MAX_SCENARIO_BYTES, "scenario file")
            except InputFileError as e:
                raise ScenarioError(str(e)) from None
            except OSError as e:
                raise ScenarioError(f"cannot read scenario file {text}: {e.strerror or e}") from None
            sc = parse_scenario(content, text)
        else:
            sc = get_scenario(text)
    return sc.perturbed(perturb) if perturb is not None else sc


__all__ = ["CALIBRATION", "CHECKS", "GPUS", "MULTI_AGENT", "PERTURB_RANGES", "SCENARIOS", "GPU", "LearningProfile", "ModelSpec",
           "MultiAgentScenario", "Scenario", "ScenarioError", "ScenarioFile", "SimConstants", "get_scenario", "load_scenario",
           "parse_scenario", "perturbed_constants"]
