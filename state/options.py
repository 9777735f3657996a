"""The typed options of a tuning session (what `mart tune` parses), stored with the run.

Secrets never live here: API keys and tokens come from the environment (or a flag kept in memory only),
because these options are written into the checkpoint DB and the ledger.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator


class TuneOptions(BaseModel):
    """Budgets, horizons and policies of one session. Defaults fit a ≤10-minute CPU session."""

    backend: str = Field("local", description="local, verl, sim, or package.module:factory")
    backend_options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the backend")
    system_trials: int = Field(6, ge=1, description="stage-1 trial budget, the baseline included")
    learning_trials: int = Field(5, ge=0, description="stage-2 trial budget, the baseline included (0 = skip)")
    system_horizon: int = Field(6, ge=1, description="steps per stage-1 trial (throughput over updates 3-5)")
    learning_horizon: int = Field(30, ge=1, description="steps per stage-2 trial")
    memory_margin: float = Field(0.1, ge=0.0, lt=1.0, description="keep peak memory <= (1 - margin) x capacity")
    memory_capacity_gb: float | None = Field(None, gt=0, description="override the backend's memory capacity")
    num_candidates: int = Field(3, ge=1, le=10, description="candidates per proposal round")
    max_revision_rounds: int = Field(2, ge=0, description="critic send-backs before a stage gives up a slot")
    wall_clock_s: float | None = Field(None, gt=0, description="optional wall-clock budget for the whole session")
    approve: Literal["auto", "tty", "none", "slack"] = "auto"
    auto_policy: Literal["all", "margin"] = Field(
        "all", description="auto approval: approve all, or only candidates predicted within the memory margin"
    )
    agents: Literal["rules", "llm"] = "rules"
    proposer: Literal["rules", "llm"] | None = Field(None, description="per-role override of `agents`")
    critic: Literal["rules", "llm"] | None = Field(None, description="per-role override of `agents`")
    llm_model: str | None = None
    llm_base_url: str | None = None
    llm_timeout_s: float = 60.0
    llm_price_per_mtok: tuple[float, float] | None = Field(None, description="USD per 1M (input, output) tokens")
    seed: int = 0
    runs_dir: str = "runs"
    quiet: bool = False
    report: bool = Field(True, description="write report.html (figures, trials, reviews, final config) into the "
                         "run folder when the session completes")
    watch_interval_s: float = Field(1.0, gt=0, description="how often a running trial's metrics are read")

    @field_validator("backend_options")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if any(word in key.lower() for word in ("key", "token", "secret", "password")):
                raise ValueError(f"backend option {key!r} looks like a secret: pass secrets through the environment")
        return v

    def proposer_strategy(self) -> str:
        return self.proposer or self.agents

    def critic_strategy(self) -> str:
        return self.critic or self.agents
