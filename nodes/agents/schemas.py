"""Structured-output schemas the LLM agents fill, and their conversion to mart's models.

OpenAI's strict ``json_schema`` mode cannot express a free-form mapping, so overrides travel as a list
of ``{key, value}`` pairs and are turned into a dict here. Every model forbids extra fields, which makes
the generated JSON schema strict-compatible (``additionalProperties: false``, every field required;
optional values are nullable instead of absent).

What the LLM returns is untrusted: ``parse_*`` only checks the *shape*; the values are checked against
the search space and its constraints by the strategies in ``mart.nodes.agents.llm``.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.utils.function_calling import convert_to_openai_function
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Scalar = bool | int | float | str | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KnobSetting(_Strict):
    """One override: a knob of the search space and its new value."""

    key: str = Field(description="the knob's exact key, as listed in the search space")
    value: Scalar = Field(description="the new value, inside the knob's range or choices")


class ProposedCandidate(_Strict):
    """One candidate configuration."""

    overrides: list[KnobSetting] = Field(
        description="only the knobs that change relative to the current best configuration"
    )
    rationale: str = Field(
        description="why this should improve the objective, citing the profile, history or feedback"
    )
    expected_gain: float | None = Field(
        description="estimated relative improvement of the objective, e.g. 0.1 for +10%; null if unknown"
    )

    def overrides_dict(self) -> dict[str, Any]:
        return {kv.key: kv.value for kv in self.overrides}


class ProposalSet(_Strict):
    """The proposer's answer: candidate configurations for the next trial, with reasons."""

    analysis: str = Field(description="two or three sentences: what limits the objective now, from the facts given")
    candidates: list[ProposedCandidate]


class CandidateVerdict(_Strict):
    """The critic's verdict on one candidate."""

    candidate_id: str = Field(description="the candidate's id, exactly as given")
    accept: bool
    reason: str = Field(description="one or two sentences a human reviewer can check")
    risk: Literal["low", "medium", "high"] = Field(description="risk of OOM, crash or regression")


class VerdictSet(_Strict):
    """The critic's answer: a verdict per candidate and the pick."""

    verdicts: list[CandidateVerdict]
    pick: str | None = Field(description="candidate_id of the accepted candidate to run next, or null if none")
    feedback: str = Field(description="if pick is null: what the proposer should change; else empty")


class CandidateCheck(BaseModel):
    """mart's own checks of one candidate, shown to the critic (not filled by the LLM)."""

    validation_errors: list[str] = Field(default_factory=list, description="search-space validation")
    constraint_errors: list[str] = Field(default_factory=list, description="cross-parameter constraints")
    predicted_memory_gb: float | None = None
    duplicate: bool = Field(False, description="identical to a trial already run in this stage")

    @property
    def ok(self) -> bool:
        return not self.validation_errors and not self.constraint_errors


SCHEMAS: dict[str, type[_Strict]] = {"proposer": ProposalSet, "critic": VerdictSet}


def openai_function(schema: type[BaseModel], *, strict: bool = True) -> dict[str, Any]:
    """``{name, description, parameters, strict}`` for tool calling (strict-mode compatible)."""
    return convert_to_openai_function(schema, strict=strict)


def openai_response_format(schema: type[BaseModel], *, strict: bool = True) -> dict[str, Any]:
    """``{name, description, schema, strict}``: the ``json_schema`` entry of a ``response_format``."""
    fn = openai_function(schema, strict=strict)
    return {"name": fn["name"], "description": fn.get("description", ""), "schema": fn["parameters"], "strict": strict}


def validation_messages(err: ValidationError, limit: int = 8) -> list[str]:
    """Short, LLM-readable messages (``candidates.0.overrides.1.key: Field required``)."""
    msgs = []
    for e in err.errors()[:limit]:
        loc = ".".join(str(p) for p in e.get("loc", ())) or "answer"
        msgs.append(f"{loc}: {e.get('msg', 'invalid')}")
    if len(err.errors()) > limit:
        msgs.append(f"... and {len(err.errors()) - limit} more")
    return msgs
