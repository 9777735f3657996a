"""The typed options of a tuning session (what `mart tune` parses), stored with the run.

Secrets never live here: API keys and tokens come from the environment (or a flag kept in memory only),
because these options are written into the checkpoint DB and the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, field_validator, model_validator

from mart.state.stages import DEFAULT_STAGES, STAGE_ORDER, StageName

#: seconds between two passes of a watch over a paused run's trials (`mart watch`, `mart slack serve`): health is
#: judged per step, and a real job's step takes a minute or more (the tuner's own watch: ``watch_interval_s``)
WATCH_INTERVAL_S = 5.0


class TuneOptions(BaseModel):
    """Budgets, horizons and policies of one session. Defaults fit a ≤10-minute CPU session.

    The single source of these options: `mart tune` builds one flag per field from the name, type,
    default and description here (``mart.graph.cli``), and unknown keys are refused everywhere (the CLI,
    Studio's input ``options``, the Python API) with the list of valid ones.
    """

    backend: str = Field("local", description="Backend: local, verl, sim, or package.module:factory.")
    backend_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the backend.")
    system_trials: int = Field(6, ge=1, description="Stage-1 trial budget (baseline included).")
    learning_trials: int = Field(5, ge=0, description="Stage-2 trial budget (baseline included; 0 skips stage 2).")
    system_horizon: int = Field(6, ge=1, description="Steps per stage-1 trial (throughput over updates 3-5).")
    learning_horizon: int = Field(30, ge=1, description="Steps per stage-2 trial.")
    stages: list[StageName] = Field(
        default_factory=lambda: [str(s) for s in DEFAULT_STAGES],
        description="Stages to run, comma-separated, in this order: system (throughput), learning (validation "
        "score), schedule (per-segment learning knobs grown by a tree search from checkpoints). E.g. "
        "system,learning,schedule or schedule alone (from the base config and --set values).",
        json_schema_extra={"metavar": "|".join(STAGE_ORDER) + ",..."})
    start_overrides: dict[str, Any] = Field(
        default_factory=dict, description="KEY=VALUE changes to the backend's base config that every stage starts "
        "from (`mart tune --set`).")
    schedule_segments: int = Field(3, ge=2, description="Schedule stage: segments S the training horizon is cut "
                                   "into; the knobs may change at each of the S-1 boundaries (checkpoints).")
    schedule_branches: int = Field(
        3, ge=2, description="Schedule stage: branches K run from a checkpoint when it is expanded, the unchanged "
        "continuation included (so K-1 reviewed transitions).")
    schedule_budget: int | None = Field(
        None, ge=1, description="Schedule stage: at most this many segment-trials, the root segment and the "
        "unchanged continuations included (default S x K: one expansion per boundary along the best path, the "
        "static path to the horizon, and a little room to back up to a sibling).")
    schedule_horizon: int | None = Field(
        None, ge=2, description="Schedule stage: total training steps T of a schedule (default: --learning-horizon); "
        "segment i ends at step round(i x T / S).")
    parallel: int = Field(
        1, ge=1, le=256, description="Trials run at once (slots). Each proposal round fills the free slots with one "
        "batch and one review; a slot that frees starts the next trial at once. 1 = one trial at a time.")
    stall_timeout_s: float | None = Field(
        None, gt=0, description="A trial with no new step for this many seconds is stopped as hung (or frozen); "
        "default: max(300, 5 x its median step time). Every backend, the same rule.")
    first_step_timeout_s: float | None = Field(
        None, gt=0, description="A trial with no training step this many seconds after launch is stopped as hung "
        "(model load, engine start, first step); default: 1 hour.")
    learning_confirm_trials: int = Field(
        3, ge=0, description="Stage 2: at most this many re-evaluations on a second seed, after the budget, of the "
        "configs whose score is within the measured noise of the winner's (0 = trust one run).")
    system_remeasure_share: float = Field(
        0.5, ge=0.0, lt=1.0, description="Stage 1: the most of the stage's trials (re-measurements included) that "
        "the interleaved re-measurement of the baseline and the best config may take before a winner is declared "
        "(0.5 with 6 trials: up to 3 rounds of a baseline and a best trial; it stops after 2 once the verdict is "
        "clear; 0 = trust one measurement).")
    memory_margin: float = Field(0.1, ge=0.0, lt=1.0,
                                 description="GPU-memory margin: keep peak <= (1 - margin) x capacity.")
    memory_capacity_gb: float | None = Field(None, gt=0, description="Memory capacity in GB (default: the backend's).")
    num_candidates: int = Field(3, ge=1, le=10, description="Candidates per proposal round.")
    max_revision_rounds: int = Field(2, ge=0, description="Critic send-backs before a stage gives up a slot.")
    wall_clock_s: float | None = Field(None, gt=0, description="Wall-clock budget in seconds for the session.")
    # tty: a person at a terminal is the default reviewer; scripts and benchmarks pass auto or none
    approve: Literal["tty", "auto", "none", "slack"] = Field(
        "tty", description="Reviewer channel: tty, auto, none (pause and exit), slack.")
    auto_policy: Literal["all", "margin"] = Field(
        "all", description="With approve=auto: approve 'all', or only candidates predicted within the memory margin "
                           "('margin')."
    )
    agents: Literal["rules", "llm"] = Field("rules", description="Agent strategy for both roles: rules or llm.")
    proposer: Literal["rules", "llm"] | None = Field(None, description="Proposer strategy (overrides agents).")
    critic: Literal["rules", "llm"] | None = Field(None, description="Critic strategy (overrides agents).")
    llm_model: str | None = Field(None, description="LLM model name (default $MART_LLM_MODEL).")
    llm_base_url: str | None = Field(None, description="OpenAI-compatible base URL (default $OPENAI_BASE_URL).")
    llm_timeout_s: float = Field(60.0, gt=0, description="Wall-clock seconds per LLM request (connect, headers and body together) before it is retried/given up.")
    llm_price_per_mtok: tuple[float, float] | None = Field(
        None, description="USD per 1M tokens as IN,OUT (shows the cost in the summary).")
    seed: int = Field(0, description="Random seed (agents and trials).")
    runs_dir: str = Field("runs", description="Where run directories live.")
    quiet: bool = Field(False, description="No progress output.")
    report: bool = Field(True, description="Write report.html (figures, trials, reviews, final config) into the "
                         "run folder when the session completes.")
    watch_interval_s: float = Field(1.0, gt=0, description="How often a running trial's metrics are read (seconds).")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # pydantic ignores extra keys by default: a typo (`system_trial=3`) would silently become the default
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if k not in cls.model_fields)
            if unknown:
                raise ValueError(f"unknown option(s) {', '.join(unknown)}; valid options: "
                                 f"{', '.join(cls.model_fields)}")
        return data

    @field_validator("stages", mode="before")
    @classmethod
    def _split_stages(cls, v: Any) -> Any:
        if isinstance(v, str):  # "system,learning" from an environment or a config file
            v = [p for p in v.split(",")]
        if isinstance(v, (list, tuple)):
            return [str(p).strip() for p in v]
        return v

    @field_validator("stages")
    @classmethod
    def _stage_order(cls, v: list[str]) -> list[str]:
        if not v:  # each name is checked by ``StageName``
            raise ValueError(f"name at least one stage of {', '.join(STAGE_ORDER)}")
        if len(set(v)) != len(v):
            raise ValueError(f"a stage is named twice in {','.join(v)}")
        if v != sorted(v, key=STAGE_ORDER.index):
            raise ValueError(f"stages run in the order {','.join(STAGE_ORDER)}; got {','.join(v)}")
        return v

    @model_validator(mode="after")
    def _schedule_fits(self) -> "TuneOptions":
        if "schedule" in self.stages and self.schedule_total_steps() < self.schedule_segments:
            raise ValueError(f"schedule: {self.schedule_segments} segments need a horizon of at least as many steps "
                             f"(got {self.schedule_total_steps()})")
        return self

    def schedule_total_steps(self) -> int:
        """T: the schedule stage's total training steps."""
        return self.schedule_horizon or self.learning_horizon

    def schedule_boundaries(self) -> list[int]:
        """The global steps at which the segments end, the last one T (``round(i x T / S)``)."""
        t, s = self.schedule_total_steps(), self.schedule_segments
        return [max(i, round(i * t / s)) for i in range(1, s + 1)]

    def schedule_trial_budget(self) -> int:
        return self.schedule_budget or self.schedule_segments * self.schedule_branches

    def runs_stage(self, stage: str) -> bool:
        """Whether the session runs ``stage``: named, and a trial budget option ``<stage>_trials`` (if the stage
        has one) that is not 0 (``learning_trials=0`` skips stage 2)."""
        return stage in self.stages and getattr(self, f"{stage}_trials", None) != 0

    @field_validator("backend_options")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if any(word in key.lower() for word in ("key", "token", "secret", "password")):
                raise ValueError(f"backend option {key!r} looks like a secret: pass secrets through the environment")
        return v

    @field_validator("llm_base_url")
    @classmethod
    def _no_userinfo(cls, v: str | None) -> str | None:
        # "https://user:password@host/v1" would land in the ledger and every checkpoint: keep host and path
        if not v:
            return v

        parts = urlsplit(v)
        if parts.username is None and parts.password is None:
            return v
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    def proposer_strategy(self) -> str:
        return self.proposer or self.agents

    def critic_strategy(self) -> str:
        return self.critic or self.agents


def backend_options(options: TuneOptions) -> dict:
    """The keyword options the session's backend factory is called with."""
    out = dict(options.backend_options)
    if options.memory_capacity_gb is not None:
        out.setdefault("memory_capacity_gb", options.memory_capacity_gb)
    return out
