#!/usr/bin/env python3
"""Mutation check: plant known, plausible bugs one at a time and check that the tests catch each one.

The modules that hold the tuner's promises (health rules and monitor, objectives, the critic, launch and
collect, the ledger, verl's log reader) get a curated list of small mutants: an inverted condition, a
dropped guard, an off-by-one window, a non-deterministic id. Each mutant names the tests that should catch it;
the script runs only those (the fast ones), so the whole check takes minutes, not hours.

It works on a private copy of the repository (tracked and untracked, non-ignored files) whose ``mart/``
package links to the copy's layer folders, so the working tree is never modified. A mutant whose
text no longer matches the code is reported as STALE: update the list when the code moves.

    python scripts/mutation_check.py              # all mutants; exit 1 if one survives or is stale
    python scripts/mutation_check.py --list       # the mutants and their tests
    python scripts/mutation_check.py --only M03 --only M06

See docs/testing.md. The idea is that of mutation testing (e.g. mutmut, cosmic-ray); a curated list keeps
the mutants meaningful and the run short on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The top-level folders the pyproject maps into ``mart.*``.
LAYERS = ("graph", "tools", "nodes", "trial_runner", "state")


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    bug: str
    tests: tuple[str, ...] = field(default_factory=tuple)
    slow: bool = False  # its tests are end-to-end ones marked `slow` (run only for this mutant and the baseline)


EARLY_STOP = "tests/graph/test_early_stop.py"
MEMORY = "tests/graph/test_memory_feasibility.py"
LAUNCH = "tests/graph/test_launch_idempotency.py"
LEDGER = "tests/state/test_ledger.py"
RULES = "tests/nodes/test_health_rules.py"
VERL_LOGS = "tests/trial_runner/test_verl_logs.py"
CRITIC = "tests/nodes/test_agents_rules.py"
STATE = "tests/state/test_state_basics.py"
MA_HEALTH = "tests/nodes/test_multi_agent_health.py"
MA_AGENTS = "tests/nodes/test_multi_agent_agents.py"
SESSION = "tests/graph/test_graph_session.py::test_two_stage_session_improves_and_fills_the_ledger"
MARGIN_HEALTH = "tests/nodes/test_margin_health_promises.py"
PARALLEL_GPUS = "tests/graph/test_parallel_gpus.py"
PROMISES = "tests/graph/test_promises_security.py"
ESCAPING = "tests/graph/test_output_escaping.py"
RUN_FOLDER = "tests/graph/test_run_folder_code.py"
ENDPOINTS = "tests/graph/test_stored_endpoints.py"
NO_FOLLOW = "tests/graph/test_no_follow_writes.py"
DAMAGED = "tests/graph/test_damaged_ledger.py"
IMPORT_VERL = "tests/trial_runner/test_import_verl.py"
LLM_HARDENING = "tests/nodes/test_llm_hardening.py"
Q_TRIALS = "tests/graph/test_promises_trials.py"
Q_REVIEW = "tests/graph/test_promises_review.py"
Q_DECISIONS = "tests/nodes/test_promises_decisions.py"
NOISE = "tests/nodes/test_decisions_under_noise.py"
WATCHDOG_RULE = "tests/graph/test_watchdog.py::test_the_stall_limit_is_five_times_the_median_step_not_the_slowest_step"

MUTANTS: tuple[Mutant, ...] = (
    # -- the bugs issue 18 planted (each survived the suite before it) --------------------------------
    Mutant("M01", "tools/stop.py", "            poll = services.runner.stop(rt.handle, reason=rt.stop_reason)",
           "    raise RuntimeError('mutant: stop_trial fails')", "stop_trial raises", (EARLY_STOP,)),
    Mutant("M02", "nodes/health_monitor.py", 'if final or not stops or record.kind == "baseline":',
           'if final or not stops or record.kind != "baseline":', "monitor stops baselines instead of candidates", (EARLY_STOP,)),
    Mutant("M03", "tools/collect.py", "eligible = eligible and outcome.feasible", "eligible = eligible",
           "an over-margin trial can become the best", (MEMORY,)),
    Mutant("M04", "state/objectives.py", "return max(vals) if vals else math.nan",
           "return vals[-1] if vals else math.nan", "peak memory = the last reading, not the max", (MEMORY, STATE)),
    Mutant("M05", "nodes/agents/rules.py", "if pred > limit:  # never", "if pred > 1.1 * limit:  # never",
           "the critic tolerates 10% over the limit", (CRITIC,)),
    Mutant("M06", "tools/launch.py", 'if existing and existing.get("handle"):', "if False:",
           "launch_trial's re-attach branch deleted (a resumed launch starts a second process)", (LAUNCH,)),
    Mutant("M07", "state/ledger.py", '{"event_id": f"{e.trial_id}:{e.scoped_rule}:{e.step}",',
           '{"event_id": f"{e.trial_id}:{e.scoped_rule}:{e.step}:{time.time_ns()}",',
           "non-deterministic health-event ids (re-runs duplicate events)", (LEDGER,)),
    Mutant("M08", "state/ledger.py", 'self.db.table("trials").upsert(row, pk="trial_id", alter=True)',
           'self.db.table("trials").insert(row, pk="trial_id", alter=True, replace=True)',
           "upsert_trial as insert-or-replace (collect wipes handle, seq, trial dir, start time)", (LEDGER,)),
    Mutant("M09", "trial_runner/verl/logs.py", r'_RAY_PREFIX_RE = re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s*")',
           r'_RAY_PREFIX_RE = re.compile(r"^\s*\(pid=\d+\)\s*")',
           "narrow Ray-prefix pattern (crash reason loses the error line)", (VERL_LOGS,)),
    Mutant("M10", "state/health.py", "rising = s[-1][1] >= s[0][1]", "rising = True",
           "clip-ratio rule drops its 'rising' condition", (RULES,)),
    Mutant("M11", "state/health.py", "ref = statistics.fmean(v for _, v in s[: cfg.warmup])",
           "ref = statistics.fmean(v for _, v in s)", "entropy reference over the whole stream, not the early steps",
           (RULES,)),
    # -- more mutants in the same modules ----------------------------------------------------------------
    Mutant("M12", "tools/collect.py", "if status is not TrialStatus.COMPLETED or early:",
           "if status is not TrialStatus.COMPLETED:", "an early-stopped trial reports its partial score as a result",
           (EARLY_STOP,)),
    Mutant("M13", "nodes/health_monitor.py", 'stops: list[HealthEvent] = [e for e in events if e.severity == "stop"]',
           "stops: list[HealthEvent] = list(events)", "a warning stops the trial (persistence ignored)", (EARLY_STOP,)),
    Mutant("M14", "state/health.py", 'severity = "stop" if persisted >= window else "warn"',
           'severity = "stop" if persisted >= 1 else "warn"', "persistence window ignored by the rules", (RULES,)),
    Mutant("M15", "state/health.py",
           'return HealthEvent(trial_id=trial_id, step=r.step, rule="nan", severity="stop",',
           'return HealthEvent(trial_id=trial_id, step=r.step, rule="nan", severity="warn",',
           "NaN metrics only warn", (RULES,)),
    Mutant("M16", "state/health.py", "best = max(v for _, v in s[: -1])", "best = max(v for _, v in s[-3:])",
           "reward collapse measured against the recent level, not the best so far", (RULES,)),
    Mutant("M17", "state/health.py", "over = [(step, v) for step, v in s if v > cfg.memory_limit_gb]",
           "over = [(step, v) for step, v in s[-1:] if v > cfg.memory_limit_gb]",
           "memory-margin rule looks at the newest reading only", (RULES,)),
    Mutant("M18", "state/objectives.py", "feasible = not math.isnan(thr) and (limit_gb is None or math.isnan(peak) "
           "or peak <= limit_gb)", "feasible = not math.isnan(thr) and (limit_gb is None or math.isnan(peak) "
           "or peak <= 1.1 * limit_gb)", "feasibility tolerates 10% over the limit", (MEMORY, STATE)),
    Mutant("M19", "state/objectives.py", "    if horizon >= last:\n        return first, last",
           "    if horizon >= last:\n        return first - 1, last", "throughput window includes update 2", (STATE,)),
    Mutant("M20", "nodes/stages/_base.py",
           "                    record.objective(stage) > incumbent.objective(stage):",
           "                    record.objective(stage) < incumbent.objective(stage):", "the worse candidate replaces the best", (SESSION, MEMORY)),
    Mutant("M21", "state/ledger.py", '        if seq is not None:\n            row["seq"] = seq',
           '        row["seq"] = seq', "a later upsert clears the trial's seq", (LEDGER,)),
    Mutant("M22", "state/ledger.py", 'self.db.table("metrics").upsert_all(rows, pk=("trial_id", "step", "key"))',
           'self.db.table("metrics").insert_all(rows, pk=("trial_id", "step", "key"), ignore=True)',
           "re-read metrics keep their first value", (LEDGER,)),
    Mutant("M23", "state/ledger.py", 'self.db.table("proposals").upsert_all([', 'self.db.table("proposals").insert_all([',
           "a re-run proposer fails on its own proposals", (LEDGER,)),
    Mutant("M24", "trial_runner/verl/logs.py", 'return m.group(1).split(",")[0].strip() if m else text',
           "return m.group(1).strip() if m else text", "tensor(0.5, device=...) is not a number", (VERL_LOGS,)),
    Mutant("M25", "trial_runner/verl/logs.py",
           "line = strip_prefixes(text[line_start: line_end if line_end >= 0 else len(text)]).strip()",
           "line = text[line_start: line_end if line_end >= 0 else len(text)].strip()",
           "an OOM reason keeps Ray's prefix", (VERL_LOGS,)),
    Mutant("M26", "trial_runner/verl/logs.py", "if returncode == 0 and (horizon is None or done >= horizon):",
           "if returncode == 0:", "exit 0 short of the horizon counts as completed", (VERL_LOGS,)),
    Mutant("M27", "tools/watch.py",
           "ledger.add_metrics(tid, f.tail.read_new())  # lines written just before the end",
           "pass", "watch drops the lines written just before the end", (EARLY_STOP, MEMORY, LAUNCH)),
    Mutant("M28", "tools/launch.py",
           '    ledger.set_trial_fields(record.trial_id, handle=handle.model_dump(mode="json"))\n',
           "", "the handle never reaches the ledger", (LAUNCH,)),
    Mutant("M29", "nodes/health_monitor.py", "services.ledger.add_health_events(events)",
           'services.ledger.add_health_events([e for e in events if record.kind != "baseline"])',
           "a baseline's health events are not recorded", (EARLY_STOP,)),
    Mutant("M30", "nodes/stages/_base.py", "{self.tried_words}\" if key in tried else None",
           "{self.tried_words}\" if False else None",
           "the critic lets a duplicate config through", (CRITIC,)),
    Mutant("M31", "state/health.py", "ref = statistics.median(v for _, v in s[: cfg.warmup])",
           "ref = max(v for _, v in s[: cfg.warmup])", "grad-norm reference is the early max, not the median",
           (RULES,)),
    Mutant("M32", "state/health.py", "n = persisting(series, lambda v: abs(v) > cfg.kl_max, cfg.window)",
           "n = persisting(series, lambda v: v > cfg.kl_max, cfg.window)",
           "a large negative KL estimate is not a blow-up", (RULES,)),
    Mutant("M33", "tools/launch.py", "status=TrialStatus.FAILED.value, reason=f\"launch failed: {e}\"",
           "status=TrialStatus.RUNNING.value, reason=f\"launch failed: {e}\"",
           "a launch that raises leaves the trial 'running' in the ledger", (LAUNCH, EARLY_STOP, MEMORY)),
    # -- multi-agent jobs (issue 14): ids MA*, so that they never collide with the numbered ones ------------
    Mutant("MA1", "nodes/health_rules.py", "events += per_agent_events(stage, trial_id, records, cfg, agents)",
           "events += []", "the health rules never read an agent's own stream", (MA_HEALTH,)),
    Mutant("MA2", "nodes/health_rules.py", "healthy = [a for a in agents if a != agent and not found[a]]",
           "healthy = [a for a in agents if a != agent]", "a sick agent's peers are called healthy", (MA_HEALTH,)),
    Mutant("MA3", "state/health.py",
           "harmful = len(run) >= cfg.pathology_stop_steps and _team_stalled_since(records, run[0][0])",
           "harmful = len(run) >= cfg.pathology_stop_steps",
           "a multi-agent pathology stops the trial while the team still improves", (MA_HEALTH,)),
    Mutant("MA4", "nodes/agents/rules.py", "return score * 0.3, f\"{why} (agent {agent} is healthy",
           "return score, f\"{why} (agent {agent} is healthy",
           "the proposer moves a healthy agent's knobs as readily as the sick one's", (MA_AGENTS,)),
    # -- untrusted input (issues 26 and 28): ids MS* ------------------------------------------------------------
    Mutant("MS1", "trial_runner/registry.py", '    if options.get("runner_options") is not None:\n        parts.append',
           '    if False:\n        parts.append', "a run folder's stored runner_options run without trust", (PROMISES,)),
    Mutant("MS2", "trial_runner/base.py", '"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", ',
           '"OPENAI_API_KEY", ', "trials inherit ANTHROPIC_API_KEY and AZURE_OPENAI_API_KEY", (PROMISES,)),
    Mutant("MS3", "trial_runner/base.py", '("SLACK_", "MART_SLACK_", "MART_LLM_")', '("SLACK_",)',
           "trials inherit MART_SLACK_* and MART_LLM_*", (PROMISES,)),
    Mutant("MS4", "state/text.py", "0x7f, *range(0x80, 0xa0)]", "0x7f]",
           "terminal and Slack text keep C1 controls (U+009B, a one-character CSI)", (ESCAPING,)),
    Mutant("MS5", "state/run_store.py", "and run_dir.parent != root:", "and not str(run_dir).startswith(str(root)):",
           "runs-dir containment by string prefix (runs-evil/x accepted)", (PROMISES,)),
    Mutant("MS6", "graph/export.py", '" ".join(shlex.quote(x) for x in launch["overrides"])',
           '" ".join(launch["overrides"])', "the exported schedule script without shell quoting", (ESCAPING,)),
    Mutant("MS7", "state/run_store.py", '        tmp = root / f".new-{run_id}-{secrets.token_hex(3)}"',
           "        tmp = run_dir", "run creation no longer atomic (a kill leaves a run without options)",
           (PROMISES,)),
    Mutant("MS8", "trial_runner/verl/runner.py", "        cwd = str(private_workdir(adir))  # see launch_cwd",
           "        cwd = str(trial_dir)", "verl/MARTI run in the trial folder: a planted module is imported",
           (RUN_FOLDER,)),
    Mutant("MS9", "graph/session.py", '    if (not trust and uses_llm and url and', '    if (False and',
           "a stored llm_base_url gets the user's API key", (ENDPOINTS,)),
    Mutant("MS10", "state/files.py", "        if _MODES[mode] == os.O_TRUNC:", "        if False:",
           "a planted link at a log mart truncates is followed, not replaced", (NO_FOLLOW,)),
    Mutant("MS11", "state/run_store.py", "        lost = self.untracked_trials()", "        lost = []",
           "a ledger that lost its -wal is continued and re-runs finished trials over their files", (DAMAGED,)),
    Mutant("MS12", "trial_runner/verl/script.py", '            return f"${{oc.env:{name}}}"',
           "            return self.vars.env[name]", "import-verl copies a secret of the environment into the config",
           (IMPORT_VERL,)),
    Mutant("MS13", "nodes/agents/llm_client.py", '        return text.replace(secret, "[redacted]")',
           "        return text", "an answer that echoes the API key is stored as is", (LLM_HARDENING,)),
    Mutant("MS14", "graph/session.py", "            if interrupt_id is not None and (not snap.interrupts",
           "            if False and (not snap.interrupts",
           "an answer to a review already decided is applied to the one asked since", (PROMISES,)),
    # -- issue 28: memory margin, health, parallel trials (the lead's) ------------------------------------
    Mutant("MP1", "nodes/agents/job_model.py", "gaps = self.phase_gaps(self._components(raw))",
           "gaps = {p: 0.0 * v for p, v in self.phase_gaps(self._components(raw)).items()}",
           "the search proposes up to the limit itself (no safety gap)", (MARGIN_HEALTH,)),
    Mutant("MP2", "nodes/agents/job_model.py", "measured = max(o.peak_gb or 0.0, self.C if o.oom else 0.0)",
           "measured = max(o.peak_gb or 0.0, 0.0)", "an OOM is no miss of the predicted peak", (MARGIN_HEALTH,)),
    Mutant("MP3", "nodes/runtime.py",
           "if job is not None and cap is not None and job.hardware.memory_gb != cap:", "if False:",
           "the job model ignores --memory-capacity-gb", (MARGIN_HEALTH,)),
    Mutant("MP4", "nodes/health_monitor.py", 'if final or not stops or record.kind == "baseline":',
           'if final or not stops or record.kind in ("baseline", "confirm"):',
           "a collapsing re-evaluation is never stopped", (MARGIN_HEALTH,)),
    Mutant("MP5", "state/health.py", "_team_stalled_since(records, run[0][0])",
           "_team_stalled_since(records, run[-1][0])", "'harmful' measured from the newest step", (MARGIN_HEALTH,)),
    Mutant("MP6", "nodes/health_monitor.py", "num_rounds=_int_or_none(record.config.get(NUM_ROUNDS))",
           "num_rounds=None", "a one-round debate warns of stale rounds", (MARGIN_HEALTH,)),
    Mutant("MP7", "trial_runner/verl/runner.py",
           '            **({"CUDA_VISIBLE_DEVICES": spec.devices} if spec.devices else {}),',
           "", "two parallel verl trials share the machine's GPUs", (PARALLEL_GPUS,)),
    Mutant("MP8", "tools/launch.py", "    free_slots = sorted(set(range(services.trial_slots())) - {r.slot for r in running.values()})",
           "    free_slots = sorted(set(range(services.trial_slots())))", "two running trials hold one slot",
           (PARALLEL_GPUS, "tests/graph/test_parallel_session.py")),
    Mutant("MP9", "tools/launch.py", '    if existing and existing.get("handle"):\n        handle = TrialHandle.model_validate(',
           '    if False:\n        handle = TrialHandle.model_validate(', "a resumed session launches a trial again (a new "
           "process or Ray job) instead of re-attaching the one whose handle the ledger holds",
           ("tests/graph/test_crash_resume.py", "tests/trial_runner/test_ray_parallel.py"), slow=True),
    Mutant("MP10", "trial_runner/verl/supervise.py", '        result["launch"] = launch', "        pass",
           "a verl attempt that ended while the tuner (killed before it saved the pid) was down is launched again "
           "on resume: the supervisor's exit.json no longer names its launch",
           ("tests/trial_runner/test_verl_runner.py",)),
    Mutant("MP11", "nodes/stages/system.py", '                  and (rt.record.kind != "baseline" or first_baseline)]',
           '                  and rt.record.kind != "baseline"]', "with several slots the baseline runs on to its end "
           "however far the bets beside it lead", ("tests/nodes/test_baseline_cut.py",)),
    Mutant("MP12", "nodes/stages/system.py", "        if plan.done and self._rerun_cut_baseline(view):",
           "        if False:", "a baseline cut for a trial that later went over the margin leaves the stage with "
           "no feasible config", ("tests/nodes/test_baseline_cut.py",)),
    Mutant("MP13", "graph/session.py", 'OPTIONAL_SUMMARY_KEYS = ("schedule", "error", "parallel")',
           'OPTIONAL_SUMMARY_KEYS = ("schedule", "error")', "mart tune --json drops how the slots were used",
           ("tests/graph/test_queued_trials.py",)),
    Mutant("MP14", "graph/session.py", "    running = running_trials(values or {}) if reviewer.waits else []",
           "    running = []", "the trials in flight go unwatched while a person answers a review at the terminal",
           ("tests/graph/test_parallel_session.py",)),
    Mutant("MP15", "tools/watch.py", 'and str(row.get("reason") or "").startswith(STOP_PREFIX)}',
           'and False}', "a trial stopped during a review is collected without its health reason",
           ("tests/graph/test_parallel_session.py",)),
    Mutant("MP16", "tools/watch.py", "while left and not quit.wait(interval) and keep_going():",
           "while left and not quit.wait(interval):",
           "`mart watch` goes on polling a paused run's trials after a driver has taken the run over",
           ("tests/graph/test_paused_watch.py",)),
    Mutant("MP17", "graph/paused_watch.py", "keep_going=still_paused, told=told)", "told=told)",
           "`mart watch` never notices that the review was answered elsewhere",
           ("tests/graph/test_paused_watch.py",)),
    Mutant("MF1", "nodes/stages/system.py", '"best": _clean(same), "gain_pct": _clean(gain),',
           '"best": _clean(t_thr), "gain_pct": _clean(gain),', "a gain over a cut baseline's steps is printed "
           "beside the best's whole-window figure, which it does not compare (issue 47: +77.4% beside 618 -> 1,217)",
           ("tests/graph/test_figures_add_up.py",)),
    Mutant("MF2", "tools/launch.py", "        return record.confirms\n", "        return None\n",
           "a re-run on a second seed is announced as changes against the current best (issue 47: `lea-07-baseline-s2: n 16→8`)",
           ("tests/graph/test_progress_events.py",)),
    # -- issue 43: stage 1 decides under noise (ids MN*) --------------------------------------------------------
    Mutant("MN1", "nodes/stages/system.py", "            elif iv.confirms_gain:", "            elif iv.known:",
           "stage 1 takes a re-measured gain whose interval covers zero", (f"{NOISE}::test_a_noisy_gain_whose_"
                                                                           "interval_covers_zero_keeps_the_baseline",)),
    Mutant("MN2", "nodes/stages/system.py",
           '            if is_repeat(tid) or f"{tid}{_REPEAT}" in ids or repeats >= MAX_REPEATS:',
           "            if True:", "a disturbed measurement is never repeated",
           (f"{NOISE}::test_a_disturbed_measurement_is_not_believed_and_is_repeated_once",)),
    Mutant("MN3", "state/evidence.py", "    return rounds_gain_interval(aligned, level=level)",
           "    return rounds_gain_interval([(sum((b for b, _ in aligned), []), sum((c for _, c in aligned), []))], "
           "level=level)",
           "the re-measurement's rounds are pooled as one: the trials' own noise on a shared machine is never seen",
           (f"{NOISE}::test_the_re_measurement_pairs_the_same_step_of_the_two_trials_of_a_round",)),
    Mutant("MN4", "nodes/stages/system.py",
           '        remeasured = sel.get("decision") == "taken" and bool(means.get("baseline"))',
           '        remeasured = False and bool(means.get("baseline"))',
           "a taken stage-1 gain is reported as the selecting measurement (the winner's curse), not its re-measurement",
           (f"{NOISE}::test_a_taken_gain_is_reported_as_its_re_measurement_not_as_the_selecting_measurement",)),
    Mutant("MN5", "state/stats.py",
           "    half = float(_st.t.ppf(0.5 + level / 2, k - 1)) * math.sqrt(max(1.0, q) / float(w.sum()))",
           "    half = float(_st.t.ppf(0.5 + level / 2, n_pairs - k)) * math.sqrt(1 / float(w.sum()))",
           "two rounds that happen to agree claim the step noise alone: intervals too narrow for a shared machine",
           ("tests/state/test_stats.py::test_two_rounds_that_happen_to_agree_do_not_claim_more_than_the_machine_gives",)),
    Mutant("MN6", "nodes/stages/system.py", "        if rm.settled(min(MIN_ROUNDS, most)) or rm.launched >= most:",
           "        if rm.settled(1) or rm.launched >= most:",
           "a stage-1 verdict settles on one round, which cannot see the trials' own noise",
           (f"{NOISE}::test_a_gain_is_taken_only_when_its_fresh_re_measurement_excludes_zero",)),
    Mutant("MN7", "nodes/stages/system.py",
           "            target = self._runner_up(rows, failed, rows[base.trial_id]) or target",
           "            target = target",
           "a best that goes over the margin when re-measured drops the gain instead of handing over to its runner-up",
           (f"{NOISE}::test_a_best_that_goes_over_the_margin_when_re_measured_hands_over_to_its_runner_up",)),
    # -- issue 46: the promises of parallel trials, the watch and the review (ids MQ*) ---------------------------
    Mutant("MQ1", "nodes/agents/batch.py", "    taken: list[dict[str, Any]] = list(anchors)",
           "    taken: list[dict[str, Any]] = []", "a batch can hold a config still running",
           (f"{Q_DECISIONS}::test_a_batch_never_holds_the_same_config_twice_nor_a_config_still_running",)),
    Mutant("MQ2", "nodes/agents/batch.py", "    return 1.0 - math.exp(-(distance / SPREAD) ** 2)",
           "    return max(0.5, 1.0 - math.exp(-(distance / SPREAD) ** 2))",
           "a copy of a config already in the batch keeps half its score: a batch can hold one config twice",
           (f"{Q_DECISIONS}::test_a_batch_never_holds_the_same_config_twice_nor_a_config_still_running",)),
    Mutant("MQ3", "tools/launch.py", '    if existing and token and existing.get("status") == TrialStatus.RUNNING.value:',
           "    if False:", "a trial started just before a kill -9 of the tuner is launched again on resume, not adopted",
           (f"{Q_TRIALS}::test_a_trial_started_just_before_a_kill_is_adopted_on_resume_not_launched_again",)),
    Mutant("MQ4", "tools/collect.py", '        fields["throughput"] = fields["score"] = None',
           '        fields["score"] = None', "a stopped or cut trial keeps its partial throughput as a result",
           (f"{Q_TRIALS}::test_a_stopped_or_cut_trial_never_keeps_a_partial_throughput_as_a_result",)),
    Mutant("MQ5", "nodes/stages/system.py", "                if within(records):", "                if True:",
           "the early-look cut measures a trial against a running one over the memory margin",
           (f"{Q_DECISIONS}::test_the_early_look_cut_never_measures_a_trial_against_one_over_the_memory_margin",)),
    Mutant("MQ6", "nodes/stages/system.py",
           '                    limit is None or row.get("peak_memory_gb") is None or row["peak_memory_gb"] <= limit):',
           "                    True):", "the early-look cut measures a trial against a finished one over the margin",
           (f"{Q_DECISIONS}::test_the_early_look_cut_never_measures_a_trial_against_one_over_the_memory_margin",)),
    Mutant("MQ7", "nodes/stages/schedule.py",
           "        if len(plan.launch) <= left and plan.propose <= max(0, left):", "        if True:",
           "the schedule budget is no hard cap (a root killed from outside runs again past it)",
           (f"{Q_TRIALS}::test_the_schedule_budget_counts_the_re_run_of_a_root_killed_from_outside",
            f"{Q_TRIALS}::test_the_schedule_budget_caps_the_segment_trials_over_budgets_and_seeds")),
    Mutant("MQ8", "nodes/agents/rules.py",
           "changes_memory = stage_base is None or pred > stage_base + ADDED_MEMORY_SHARE * limit",
           "changes_memory = stage_base is None or pred > stage_base + max(0.5, ADDED_MEMORY_SHARE * limit)",
           "stage 2's memory hold has an absolute 0.5 GB floor: issue 43's n=16 candidate over the limit is admitted",
           (Q_DECISIONS,)),
    Mutant("MQ9", "nodes/agents/rules.py", '            mem.risk = "high"\n            if changes_memory:',
           "            if changes_memory:",
           "a candidate predicted over the limit (as its stage's base is) is admitted as 'risk low'", (Q_DECISIONS,)),
    Mutant("MQ10", "graph/run_status.py", '{"configurable": {"thread_id": run_id, STRICT_RESUME: True}',
           '{"configurable": {"thread_id": run_id, STRICT_RESUME: False}',
           "LangGraph's strict resume is off for every run mart drives", (Q_REVIEW,)),
    Mutant("MQ11", "graph/session.py", "    config = graph_config(store.run_id)\n    ledger = store.ledger",
           '    config = {"configurable": {"thread_id": store.run_id}, "recursion_limit": 100_000}\n'
           "    ledger = store.ledger", "the CLI's and the Slack server's runs resume without LangGraph's strict mode",
           (Q_REVIEW,)),
    Mutant("MQ12", "graph/api.py", "self.config: dict[str, Any] = graph_config(store.run_id)",
           'self.config: dict[str, Any] = {"configurable": {"thread_id": store.run_id}, "recursion_limit": 100_000}',
           "the Python API's runs resume without LangGraph's strict mode", (Q_REVIEW,)),
    Mutant("MQ13", "state/models.py",
           "        unknown = sorted({d.candidate_id for d in named if d.candidate_id} - set(candidate_ids))",
           "        unknown = []", "a decision naming a candidate not in the batch is accepted (the rest applied)",
           (Q_REVIEW,)),
    Mutant("MQ14", "graph/export.py", "    args = [shlex.quote(_override(k, v)) for k, v in sorted(config.items())]",
           "    args = [_override(k, v) for k, v in sorted(config.items())]",
           "`mart export --format sh` of the final config without shell quoting",
           (f"{Q_TRIALS}::test_export_sh_shell_quotes_every_override_of_the_final_config",)),
    Mutant("MQ15", "trial_runner/watchdog.py", "            expected = sorted(self.step_times)[len(self.step_times) // 2]",
           "            expected = max(self.step_times)", "the watchdog's stall limit comes from the slowest step, not "
           "five times the median", (WATCHDOG_RULE,)),
)


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file() or rel.startswith(".venv/"):
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)


def _package_dir(src: Path) -> None:
    """Links ``mart/<layer>`` -> the copy's layer folders, so ``import mart.x`` reads the mutated copy (the
    copy's own ``mart/`` comes first on the path, before an editable install of the working tree)."""
    for layer in LAYERS:
        (src / "mart" / layer).symlink_to(src / layer, target_is_directory=True)


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest(src: Path, env: dict[str, str], tests: tuple[str, ...], timeout_s: float,
            slow: bool = False) -> tuple[int, str, float]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *([] if slow else ["-m", "not slow"]),
           *tests]
    t0 = time.monotonic()
    # its own process group, so that a time-out can reach what the tests started
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGINT first: pytest then runs the fixtures' teardown (a Ray head started with `ray start` lives in a
        # session of its own, and only its fixture stops it; a plain kill left one running); then the group
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        return 124, "timed out", time.monotonic() - t0
    return proc.returncode, out[-2000:], time.monotonic() - t0


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("FAILED") or line.startswith("ERROR"):
            return line.split(" - ")[0].removeprefix("FAILED ").removeprefix("ERROR ")
    return output.strip().splitlines()[-1] if output.strip() else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--only", action="append", default=[], metavar="ID", help="run only these mutants")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant run (default 300)")
    args = ap.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id}  {m.path}: {m.bug}\n      tests: {', '.join(m.tests)}")
        return 0
    unknown = set(args.only) - {m.id for m in MUTANTS}
    if unknown:
        ap.error(f"unknown mutant id(s): {', '.join(sorted(unknown))}")

    with tempfile.TemporaryDirectory(prefix="mart-mutants-") as tmp:
        src = Path(tmp) / "src"
        _copy_repo(src)
        _package_dir(src)
        env = _env(src)
        where = subprocess.run([sys.executable, "-c", "import mart.state; print(mart.state.__file__)"], cwd=src,
                               env=env, capture_output=True, text=True)
        if not where.stdout.startswith(str(src)):
            print(f"error: `import mart` does not resolve to the copy ({where.stdout.strip() or where.stderr})")
            return 2
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        rc, out, secs = _pytest(src, env, tests, args.timeout * 2, slow=any(m.slow for m in mutants))
        if rc != 0:
            print(f"error: the tests fail without any mutant ({secs:.0f} s):\n{out}")
            return 2
        print(f"unmutated: {len(tests)} test targets pass ({secs:.0f} s)")
        survived, stale = [], []
        for m in mutants:
            path = src / m.path
            original = path.read_text()
            if original.count(m.old) != 1:
                stale.append(m)
                print(f"{m.id} STALE     {m.path}: the mutated text occurs {original.count(m.old)} times")
                continue
            path.write_text(original.replace(m.old, m.new))
            try:
                rc, out, secs = _pytest(src, env, m.tests, args.timeout, slow=m.slow)
            finally:
                path.write_text(original)
            if rc == 0:
                survived.append(m)
                print(f"{m.id} SURVIVED  {m.bug} ({m.path}; {secs:.0f} s)")
            else:
                how = "timed out" if rc == 124 else _first_failure(out)
                print(f"{m.id} killed    {m.bug}\n      by {how} ({secs:.0f} s)")
    print(f"\n{len(mutants) - len(survived) - len(stale)} killed, {len(survived)} survived, {len(stale)} stale "
          f"of {len(mutants)} mutants")
    return 1 if survived or stale else 0


if __name__ == "__main__":
    sys.exit(main())
