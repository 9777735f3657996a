"""The ledger: every trial, metric, proposal, critique, review, health event and stage result of a run.

sqlite-utils tables in the run's SQLite file (beside LangGraph's checkpoint tables). Rows use
deterministic primary keys and upserts, so a node that re-runs after a crash does not duplicate them.
"""

from __future__ import annotations

import importlib
import json
import math
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from mart.state.metrics import StepRecord
from mart.state.models import Candidate, Critique, HealthEvent, ReviewDecision, TrialRecord


def _import_sqlite_utils() -> Any:
    """sqlite_utils without pandas: it imports pandas at its top (0.7-0.9 s) only to map ``pandas.Timestamp``
    columns, which the ledger never writes, and every command pays for it (``mart status``, each refusal). A pandas
    imported before is kept (its mapping too)."""
    if "sqlite_utils.db" in sys.modules or "pandas" in sys.modules:
        return importlib.import_module("sqlite_utils")
    sys.modules["pandas"] = None  # type: ignore[assignment]  # meanwhile `import pandas` raises ImportError
    try:
        return importlib.import_module("sqlite_utils")
    finally:
        if "pandas" in sys.modules and sys.modules["pandas"] is None:
            del sys.modules["pandas"]


sqlite_utils = _import_sqlite_utils()

DB_FILE = "mart.sqlite"

# tables stored in their primary key's b-tree: metrics' (trial_id, step, key) lookups need no separate index (half
# the table's bytes as a rowid table); a ledger made before keeps its rowid table and index, both read and upsert
# the same way (https://www.sqlite.org/withoutrowid.html)
_WITHOUT_ROWID = frozenset({"metrics"})
_SCHEMAS: dict[str, tuple[dict[str, type], str | tuple[str, ...]]] = {
    "runs": ({"run_id": str, "created_at": float, "updated_at": float, "status": str, "options": str,
              "summary": str, "error": str, "pid": int}, "run_id"),
    "trials": ({"trial_id": str, "run_id": str, "seq": int, "stage": str, "kind": str, "candidate_id": str,
                "config": str, "overrides": str, "status": str, "reason": str, "handle": str, "trial_dir": str,
                "started_at": float, "ended_at": float, "steps_done": int, "horizon": int, "throughput": float,
                "peak_memory_gb": float, "score": float, "early_stopped": int, "wall_s": float,
                # the trial tree (null: started from the base model)
                "parent_trial": str, "parent_checkpoint": str, "parent_step": int,
                # re-evaluations under noise: the trial's own seed, the trial whose config it repeats
                "seed": int, "confirms": str,
                # parallel trials: the slot it held, when it was queued, the token its launch was recorded under
                "slot": int, "queued_at": float, "launch_token": str,
                # launched but waiting for its resources (what for, since when; null once it runs), when it began to run
                "waiting": str, "waiting_since": float, "running_at": float}, "trial_id"),
    "metrics": ({"trial_id": str, "step": int, "key": str, "value": float}, ("trial_id", "step", "key")),
    "proposals": ({"candidate_id": str, "run_id": str, "stage": str, "round": int, "overrides": str,
                   "rationale": str, "source": str, "predicted_memory_gb": float, "expected_gain": float,
                   "predicted_throughput": float, "created_at": float}, "candidate_id"),
    "critiques": ({"candidate_id": str, "run_id": str, "accepted": int, "picked": int, "reasons": str,
                   "predicted_memory_gb": float, "risk": str, "score": float, "created_at": float}, "candidate_id"),
    "reviews": ({"review_id": str, "run_id": str, "candidate_id": str, "action": str, "edits": str,
                 "feedback": str, "reviewer": str, "channel": str, "created_at": float,
                 # one review can decide several candidates (one per free trial slot): its number groups them
                 "review_no": int}, "review_id"),
    # the agents' answers to a reviewer's questions (decision type "respond"), kept so a resumed review node
    # shows the same answer instead of asking the agents again
    "review_answers": ({"answer_id": str, "run_id": str, "question": str, "answer": str, "created_at": float},
                       "answer_id"),
    "health_events": ({"event_id": str, "trial_id": str, "step": int, "rule": str, "severity": str,
                       "message": str, "value": float, "created_at": float, "agent": int}, "event_id"),
    "stage_results": ({"run_id": str, "stage": str, "baseline_trial": str, "best_trial": str,
                       "baseline_value": float, "best_value": float, "best_config": str, "note": str},
                      ("run_id", "stage")),
    "profiles": ({"run_id": str, "stage": str, "trial_id": str, "profile": str}, ("run_id", "stage")),
    "agent_calls": ({"call_id": str, "run_id": str, "role": str, "strategy": str, "ok": int,
                     "fallback_reason": str, "error": str, "model": str, "prompt_version": str, "prompt_tokens": int, "completion_tokens": int, "cost_usd": float,
                     "latency_s": float, "attempt": int, "raw_answer": str, "created_at": float}, "call_id"),
}


class _Row(BaseModel):
    # a ledger written by a newer mart may hold more columns: they are kept, not refused
    model_config = ConfigDict(extra="allow")


class TrialRow(_Row):
    """One row of ``trials`` as read: the JSON columns decoded, every column typed (a value of the wrong type is
    a damaged ledger and fails here, naming the column, instead of deep in a node)."""

    trial_id: str
    run_id: str | None = None
    seq: int | None = None
    stage: str | None = None
    kind: str | None = None
    candidate_id: str | None = None
    config: dict[str, Any] = {}
    overrides: dict[str, Any] | None = None
    status: str | None = None
    reason: str | None = None
    handle: dict[str, Any] | None = None
    trial_dir: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    steps_done: int | None = None
    horizon: int | None = None
    throughput: float | None = None
    peak_memory_gb: float | None = None
    score: float | None = None
    early_stopped: bool = False
    wall_s: float | None = None
    parent_trial: str | None = None
    parent_checkpoint: str | None = None
    parent_step: int | None = None
    seed: int | None = None
    confirms: str | None = None
    slot: int | None = None
    queued_at: float | None = None
    launch_token: str | None = None
    waiting: str | None = None
    waiting_since: float | None = None
    running_at: float | None = None


class RunRow(_Row):
    """One row of ``runs`` as read (options and summary decoded)."""

    run_id: str
    created_at: float | None = None
    updated_at: float | None = None
    status: str | None = None
    options: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    pid: int | None = None


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection; falls back to ``immutable=1`` where SQLite cannot even make its WAL index
    (read-only media)."""
    uri = f"file:{quote(str(path))}"
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False, timeout=10)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)



def _num(v: float | None) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def _json(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


class Ledger:
    """Queryable record of a run. One instance per process; writes are small and immediate."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly:  # status and listings: never write (read-only media, someone else's run)
            self.db = sqlite_utils.Database(connect_readonly(self.path))
            return
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        self.db = sqlite_utils.Database(conn)
        self.ensure_schema()

    @classmethod
    def open(cls, run_dir: str | Path) -> "Ledger":
        return cls(Path(run_dir) / DB_FILE)

    def ensure_schema(self) -> None:
        for name, (columns, pk) in _SCHEMAS.items():
            table = self.db.table(name)
            if not table.exists():
                if name in _WITHOUT_ROWID:
                    # sqlite-utils has no WITHOUT ROWID option: its own CREATE TABLE, with the clause added
                    sql = self.db.create_table_sql(name, columns, pk=pk).strip().removesuffix(";")
                    self.db.execute(f"{sql} WITHOUT ROWID")
                else:
                    table.create(columns, pk=pk)
                continue
            have = set(table.columns_dict)
            for col, typ in columns.items():  # a ledger from an older mart gains the new nullable columns
                if col not in have:
                    table.add_column(col, typ)

    def close(self) -> None:
        self.db.conn.close()

    # -- runs -------------------------------------------------------------------------------------
    def upsert_run(self, run_id: str, **fields: Any) -> None:
        row = {"run_id": run_id, "updated_at": time.time(), **fields}
        for key in ("options", "summary", "snapshot"):
            if key in row and not isinstance(row[key], str) and row[key] is not None:
                row[key] = _json(row[key])
        if not self.db.table("runs").count_where("run_id = ?", [run_id]):
            row.setdefault("created_at", time.time())
        self.db.table("runs").upsert(row, pk="run_id", alter=True)

    def run(self, run_id: str | None = None) -> dict[str, Any] | None:
        row = self.run_row(run_id)
        return None if row is None else row.model_dump()

    def run_row(self, run_id: str | None = None) -> RunRow | None:
        rows = list(self.db.table("runs").rows_where("run_id = ?", [run_id]) if run_id else self.db.table("runs").rows)
        if not rows:
            return None
        row = dict(rows[0])
        for key in ("options", "summary", "snapshot"):
            if row.get(key):
                row[key] = json.loads(row[key])
        return RunRow.model_validate(row)

    # -- trials -----------------------------------------------------------------------------------
    def upsert_trial(self, record: TrialRecord, *, run_id: str, seq: int | None = None, **extra: Any) -> None:
        row: dict[str, Any] = {
            "trial_id": record.trial_id, "run_id": run_id, "stage": record.stage, "kind": record.kind,
            "candidate_id": record.candidate_id, "config": _json(record.config), "status": record.status.value,
            "reason": record.reason, "steps_done": record.steps_done, "throughput": _num(record.throughput),
            "peak_memory_gb": _num(record.peak_memory_gb), "score": _num(record.score),
            "early_stopped": int(record.early_stopped), "wall_s": record.wall_s,
            "parent_trial": record.parent_trial, "parent_checkpoint": record.parent_checkpoint,
            "parent_step": record.parent_step, "seed": record.seed, "confirms": record.confirms,
        }
        if seq is not None:
            row["seq"] = seq
        for key, value in extra.items():
            row[key] = _json(value) if isinstance(value, (dict, list)) else value
        self.db.table("trials").upsert(row, pk="trial_id", alter=True)

    def set_trial_fields(self, trial_id: str, **fields: Any) -> None:
        fields = {k: (_json(v) if isinstance(v, (dict, list)) else v) for k, v in fields.items()}
        self.db.table("trials").update(trial_id, fields, alter=True)

    def trial(self, trial_id: str) -> dict[str, Any] | None:
        rows = list(self.db.table("trials").rows_where("trial_id = ?", [trial_id]))
        return self._decode_trial(rows[0]).model_dump() if rows else None

    def trials(self, stage: str | None = None) -> list[dict[str, Any]]:
        """Every trial (of ``stage``) in launch order, as plain dicts of :class:`TrialRow`."""
        return [r.model_dump() for r in self.trial_rows(stage)]

    def trial_rows(self, stage: str | None = None) -> list[TrialRow]:
        where, args = ("stage = ?", [stage]) if stage else (None, [])
        return [self._decode_trial(r) for r in self.db.table("trials").rows_where(where, args, order_by="seq")]

    @staticmethod
    def _decode_trial(row: dict[str, Any]) -> TrialRow:
        row = dict(row)
        for key in ("config", "overrides", "handle"):
            if row.get(key):
                row[key] = json.loads(row[key])
            elif key == "config":
                row[key] = {}
        row["early_stopped"] = bool(row.get("early_stopped"))
        return TrialRow.model_validate(row)

    # -- metrics ----------------------------------------------------------------------------------
    def add_metrics(self, trial_id: str, records: Iterable[Any]) -> int:
        rows = [
            {"trial_id": trial_id, "step": rec.step, "key": k, "value": _num(v)}
            for rec in records for k, v in rec.data.items()
        ]
        if rows:
            self.db.table("metrics").upsert_all(rows, pk=("trial_id", "step", "key"))
        return len(rows)

    def metric_records(self, trial_id: str) -> list[Any]:
        by_step: dict[int, dict[str, float]] = {}
        for r in self.db.table("metrics").rows_where("trial_id = ?", [trial_id], order_by="step"):
            by_step.setdefault(r["step"], {})[r["key"]] = math.nan if r["value"] is None else r["value"]
        return [StepRecord(step=s, data=d) for s, d in sorted(by_step.items())]

    # -- agents and reviews -----------------------------------------------------------------------
    def add_proposals(self, run_id: str, round_: int, candidates: list[Candidate]) -> None:
        now = time.time()
        self.db.table("proposals").upsert_all([
            {"candidate_id": c.candidate_id, "run_id": run_id, "stage": c.stage, "round": round_,
             "overrides": _json(c.overrides), "rationale": c.rationale, "source": c.source,
             "predicted_memory_gb": _num(c.predicted_memory_gb), "expected_gain": _num(c.expected_gain),
             "predicted_throughput": _num(c.predicted_throughput), "created_at": now} for c in candidates
        ], pk="candidate_id", alter=True)

    def predictions(self, run_id: str) -> dict[str, dict[str, Any]]:
        """candidate_id -> what was predicted before it ran (throughput, peak) and who proposed it."""
        if "predicted_throughput" not in self.db.table("proposals").columns_dict:
            self.db.table("proposals").add_column("predicted_throughput", float)
        sql = ("select candidate_id, predicted_throughput, predicted_memory_gb, source from proposals where run_id = ?")
        return {cid: {"predicted_throughput": thr, "predicted_memory_gb": mem, "source": src}
                for cid, thr, mem, src in self.db.execute(sql, [run_id]).fetchall()}

    def prediction_record(self, run_id: str, stage: str = "system") -> list[dict[str, Any]]:
        """Predicted vs measured throughput and peak of every finished trial of a stage, in order."""
        preds = self.predictions(run_id)
        out = []
        for t in self.trials(stage):
            p = preds.get(t.get("candidate_id") or "", {})
            if t.get("status") == "running":
                continue
            row = {"trial_id": t["trial_id"], "source": p.get("source") or t.get("kind"),
                   "predicted_throughput": p.get("predicted_throughput"), "throughput": t.get("throughput"),
                   "predicted_peak_gb": p.get("predicted_memory_gb"), "peak_memory_gb": t.get("peak_memory_gb"),
                   "status": t.get("status")}
            if row["predicted_throughput"] and row["throughput"]:
                row["throughput_error_pct"] = round(100 * (row["throughput"] / row["predicted_throughput"] - 1), 2)
            if row["predicted_peak_gb"] is not None and row["peak_memory_gb"] is not None:
                row["peak_error_gb"] = round(row["peak_memory_gb"] - row["predicted_peak_gb"], 3)
            out.append(row)
        return out

    def decision_sources(self, run_id: str) -> dict[str, int]:
        """How many run trials each strategy proposed (rules/model, llm, reviewer-edit): the LLM's share."""
        sql = ("select p.source, count(*) from trials t join proposals p on p.candidate_id = t.candidate_id "
               "where t.run_id = ? group by p.source")
        return {src: n for src, n in self.db.execute(sql, [run_id]).fetchall()}

    def add_critiques(self, run_id: str, critiques: list[Critique], picks: str | list[str] | None) -> None:
        """The critic's verdicts; ``picks``: the candidate (or, for a batch, candidates) it chose."""
        now = time.time()
        chosen = set([picks] if isinstance(picks, str) else picks or [])
        self.db.table("critiques").upsert_all([
            {"candidate_id": c.candidate_id, "run_id": run_id, "accepted": int(c.accepted),
             "picked": int(c.candidate_id in chosen), "reasons": _json(c.reasons),
             "predicted_memory_gb": _num(c.predicted_memory_gb), "risk": c.risk, "score": _num(c.score),
             "created_at": now} for c in critiques
        ], pk="candidate_id")

    def add_review(self, run_id: str, review_id: str, candidate_id: str, decision: ReviewDecision, *,
                   review_no: int | None = None) -> None:
        """One candidate's decision (``decision`` holds that one, ``decisions[0]``)."""
        d = decision.decisions[0]
        self.db.table("reviews").upsert({
            "review_id": review_id, "run_id": run_id, "candidate_id": candidate_id, "action": d.type,
            "edits": _json(d.edits), "feedback": d.message, "reviewer": decision.reviewer,
            "channel": decision.channel, "created_at": time.time(), "review_no": review_no,
        }, pk="review_id", alter=True)

    def review_answer(self, answer_id: str) -> str | None:
        rows = list(self.db.table("review_answers").rows_where("answer_id = ?", [answer_id]))
        return rows[0]["answer"] if rows else None

    def set_review_answer(self, run_id: str, answer_id: str, question: str, answer: str) -> None:
        self.db.table("review_answers").upsert({"answer_id": answer_id, "run_id": run_id, "question": question,
                                          "answer": answer, "created_at": time.time()}, pk="answer_id")

    def rejected_overrides(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        """Overrides of the candidates a reviewer rejected in ``stage``."""
        sql = ("select p.overrides from reviews r join proposals p on p.candidate_id = r.candidate_id "
               "where r.run_id = ? and r.action = 'reject' and p.stage = ?")
        return [json.loads(o) for (o,) in self.db.execute(sql, [run_id, stage]).fetchall()]

    def add_health_events(self, events: list[HealthEvent]) -> None:
        if events:
            self.db.table("health_events").upsert_all([
                {"event_id": f"{e.trial_id}:{e.scoped_rule}:{e.step}", "trial_id": e.trial_id, "step": e.step,
                 "rule": e.rule, "severity": e.severity, "message": e.message, "value": _num(e.value),
                 "agent": e.agent, "created_at": time.time()} for e in events
            ], pk="event_id")

    def health_events(self, trial_id: str | None = None) -> list[HealthEvent]:
        where, args = ("trial_id = ?", [trial_id]) if trial_id else (None, [])
        return [
            HealthEvent(trial_id=r["trial_id"], step=r["step"], rule=r["rule"], severity=r["severity"],
                        message=r["message"], value=r["value"], agent=r.get("agent"))
            for r in self.db.table("health_events").rows_where(where, args, order_by="created_at")
        ]

    def add_agent_calls(self, run_id: str, prefix: str, calls: list[Any]) -> None:
        if calls:
            self.db.table("agent_calls").upsert_all([
                {"call_id": f"{prefix}:{i}", "run_id": run_id, "role": c.role, "strategy": c.strategy,
                 "ok": int(c.ok), "fallback_reason": c.fallback_reason, "error": c.error, "model": c.model,
                 "prompt_version": c.prompt_version, "prompt_tokens": c.prompt_tokens,
                 "completion_tokens": c.completion_tokens, "cost_usd": _num(c.cost_usd),
                 "latency_s": c.latency_s, "attempt": getattr(c, "attempt", None),
                 "raw_answer": getattr(c, "raw_answer", None), "created_at": time.time()} for i, c in enumerate(calls)
            ], pk="call_id", alter=True)

    def agent_usage(self, run_id: str) -> dict[str, Any]:
        rows = list(self.db.table("agent_calls").rows_where("run_id = ?", [run_id]))
        return {
            "calls": len(rows),
            "fallbacks": sum(1 for r in rows if r["fallback_reason"]),
            "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows),
            "completion_tokens": sum(r["completion_tokens"] or 0 for r in rows),
            "cost_usd": round(sum(r["cost_usd"] or 0.0 for r in rows), 6),
            "repairs": sum(1 for r in rows if (r.get("attempt") or 1) > 1),
            "invalid_answers": sum(1 for r in rows if r["strategy"] == "llm" and not r["ok"]),
            "trials_by_source": self.decision_sources(run_id),
        }

    def set_profile(self, run_id: str, stage: str, trial_id: str, profile: Any) -> None:
        self.db.table("profiles").upsert({"run_id": run_id, "stage": stage, "trial_id": trial_id,
                                    "profile": profile.model_dump_json()}, pk=("run_id", "stage"))

    def set_stage_result(self, run_id: str, stage: str, **fields: Any) -> None:
        row = {"run_id": run_id, "stage": stage, **fields}
        if isinstance(row.get("best_config"), dict):
            row["best_config"] = _json(row["best_config"])
        for k in ("baseline_value", "best_value"):
            if k in row:
                row[k] = _num(row[k])
        self.db.table("stage_results").upsert(row, pk=("run_id", "stage"), alter=True)

    def table_rows(self, name: str) -> list[dict[str, Any]]:
        return list(self.db.table(name).rows)
