"""One figure per concept, one name per knob, wherever a session's result is shown: the terminal's table,
``--json``, the report and Slack's final message read the same numbers, and two knobs whose last segments are
the same never print as one name twice.

The oracles are computed from the ledger's trial rows (the scores each run logged), not from the summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mart.graph.figures import KEPT, knob_lines
from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.options import TuneOptions
from mart.state.search_space import display_names
from mart.trial_runner.registry import load_backend
from tests.support.cli import TOY, cli, sim_stage2_options
from tests.support.toy_backend import REF_LP, ROLLOUT_LP


@pytest.mark.parametrize("backend", ["local", "verl", "sim"])
def test_every_catalogue_gets_distinct_names_each_a_suffix_of_its_key(backend):
    keys = [p.key for p in load_backend(backend).search_space().params]
    names = display_names(keys)
    assert len(set(names.values())) == len(keys), [n for n in names.values() if list(names.values()).count(n) > 1]
    for key, name in names.items():
        assert key == name or key.endswith("." + name)
    # a name is as short as it can be: one segment fewer would collide with another key (or be empty)
    for key, name in names.items():
        if "." in name:
            shorter = name.split(".", 1)[1]
            assert any(o != key and (o == shorter or o.endswith("." + shorter)) for o in keys), name


def test_a_session_whose_best_config_has_colliding_short_names_prints_each_knob_once(tmp_path):
    runs = str(tmp_path)
    first = json.loads(cli("tune", "--backend", TOY, "--backend-option", "log_prob_knobs=true", "--approve", "none",
                           "--runs-dir", runs, "--system-trials", "2", "--learning-trials", "0", "--system-horizon",
                           "3", "--watch-interval-s", "0.01", "--no-report", "--json", "-q").stdout)
    run = first["run_id"]
    # the reviewer edits both log-prob micro batches into the candidate (by their dotted suffixes)
    out = cli("review", run, "--runs-dir", runs, "--edit", "rollout.log_prob_micro_batch_size_per_gpu=8",
              "--edit", "ref.log_prob_micro_batch_size_per_gpu=16", "-q")
    assert out.exit_code == 0, out.output
    ledger = Ledger.open(Path(runs) / run)
    best = ledger.table_rows("stage_results")[0]
    cand = ledger.trial(best["best_trial"])
    assert cand["kind"] == "candidate", "precondition: the edited candidate is the system stage's best"
    assert cand["config"][ROLLOUT_LP] == 8 and cand["config"][REF_LP] == 16
    table = out.stdout
    assert "rollout.log_prob_micro_batch_size_per_gpu=8" in table
    assert "ref.log_prob_micro_batch_size_per_gpu=16" in table
    assert not re.search(r"(?<![.\w])log_prob_micro_batch_size_per_gpu=", table), table
    report = Path(cli("report", run, "--runs-dir", runs, "--format", "md").stdout.strip()).read_text()
    trial_line = next(line for line in report.splitlines() if line.startswith(f"| {cand['trial_id']} "))
    trial_line = re.sub(r"\\(.)", r"\1", trial_line)  # as Markdown renders it (the report escapes its text)
    assert "rollout.log_prob_micro_batch_size_per_gpu=8" in trial_line
    assert "ref.log_prob_micro_batch_size_per_gpu=16" in trial_line
    lines = knob_lines({ROLLOUT_LP: 8, REF_LP: 16})  # what Slack's final message lists
    assert len(set(lines)) == 2 and all(line.split("=")[0] in (ROLLOUT_LP, REF_LP) or "." in line for line in lines)


def _means(ledger: Ledger, trial_id: str) -> float:
    """The mean score over a config's runs (its first trial and its re-runs on another seed), from the ledger."""
    runs = [r["score"] for r in ledger.trials("learning")
            if (r["trial_id"] == trial_id or r.get("confirms") == trial_id) and r["status"] == "completed"]
    return sum(runs) / len(runs)


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    """A sim session whose stage 2 re-ran the baseline and a change on a second seed (seed 0 of this scenario)."""
    tmp_path = tmp_path_factory.mktemp("figures")
    return tmp_path, tune(sim_stage2_options(tmp_path, seed=0, report=True))["run_id"]


def test_terminal_json_and_report_show_the_same_stage2_figures(sim_run):
    tmp_path, run = sim_run
    ledger = Ledger.open(tmp_path / run)
    learning = {r["stage"]: r for r in ledger.table_rows("stage_results")}["learning"]
    base_id, best_id = learning["baseline_trial"], learning["best_trial"]
    confirmed = {r.get("confirms") for r in ledger.trials("learning") if r["kind"] == "confirm"}
    assert base_id in confirmed, "precondition: the baseline was re-run, so its figure is a mean of two runs"
    base, best = round(_means(ledger, base_id), 4), round(_means(ledger, best_id), 4)
    single = round(ledger.trial(base_id)["score"], 4)
    assert single != base, "precondition: the baseline's single run and its mean differ at 4 digits"

    as_json = json.loads(cli("resume", run, "--runs-dir", str(tmp_path), "--json").stdout)["learning"]
    assert (round(as_json["baseline_score"], 4), round(as_json["best_score"], 4)) == (base, best)

    terminal = cli("resume", run, "--runs-dir", str(tmp_path)).stdout
    row = next(line for line in terminal.splitlines() if "learning (val score)" in line)
    shown = [float(x) for x in re.findall(r"\d\.\d{4}", row)]
    assert shown[:2] == [base, best], row

    report = Path(cli("report", run, "--runs-dir", str(tmp_path), "--format", "md").stdout.strip()).read_text()
    head = next(line for line in report.splitlines() if line.startswith("- **learning stage**"))
    assert [float(x) for x in re.findall(r"\d\.\d{4}", head)][:2] == [base, best], head
    if best_id == base_id:  # kept: said in words, never as a signed zero
        assert KEPT in row and KEPT in head and "-0.0000" not in row + head


def test_the_learning_plot_draws_only_what_the_verdict_took_and_single_runs_as_points(sim_run):
    from mart.graph.report_data import LEARNING_PLOT_RULE, learning_best, load_run

    tmp_path, run = sim_run
    ledger = Ledger.open(tmp_path / run)
    rows = ledger.trials("learning")
    result = {r["stage"]: r for r in ledger.table_rows("stage_results")}["learning"]
    number = {r["trial_id"]: i for i, r in enumerate(rows, 1)}
    ok = [r for r in rows if r["status"] == "completed" and not r["early_stopped"]]
    reran = {r["confirms"] for r in ok if r.get("confirms")}
    drawn = learning_best(load_run(tmp_path / run))
    assert reran, "precondition: some config was re-run"
    taken = None if result["best_trial"] == result["baseline_trial"] else result["best_trial"]
    assert drawn.taken == taken
    if taken is None:  # the baseline was kept: no line above it for a re-run config the verdict did not take
        assert all(y != y for y in drawn.line), drawn.line
    else:  # the taken change's mean over its runs, from the trial its last run ended
        done_at = max(number[r["trial_id"]] for r in ok if taken in (r["trial_id"], r.get("confirms")))
        for x, y in zip(drawn.xs, drawn.line):
            assert (y != y) if x < done_at else y == pytest.approx(_means(ledger, taken)), (x, y)
    singles = {(number[r["trial_id"]], r["score"]) for r in ok if not r.get("confirms") and r["trial_id"] not in reran}
    assert set(drawn.single) == singles and singles  # unconfirmed runs are points
    page = (tmp_path / run / "report.html").read_text()
    assert LEARNING_PLOT_RULE.split(":")[0] in page and "two seeds" in page
    # the verdict's numbers are on the page: lead, bar, standard error, the rule
    assert "learning verdict" in page and "the bar" in page and "standard error of the difference" in page
    assert "rule: a change replaces the baseline only when it ran on two seeds" in page


def test_a_kept_baseline_gets_no_taken_line_even_when_a_re_run_change_led_it(tmp_path):
    from mart.graph.report_data import learning_best, load_run

    # seed 1 of this scenario keeps the baseline although a change re-run on two seeds led it (the case)
    seed = 1
    run = tune(sim_stage2_options(tmp_path / str(seed), seed=seed, report=False))
    assert run["learning"]["kept_baseline"] and any(
        c["runs"] >= 2 and c["mean"] > run["learning"]["baseline_score"] for c in run["learning"]["contenders"]), \
        "precondition: a re-run change led the kept baseline"
    drawn = learning_best(load_run(tmp_path / str(seed) / run["run_id"]))
    assert drawn.taken is None and all(y != y for y in drawn.line) and drawn.reran
    assert run["learning"]["verdict"].startswith("lea-") and "the bar" in run["learning"]["verdict"]


def test_a_multi_agent_report_has_a_panel_only_for_the_curves_it_logged(tmp_path):
    import sqlite3

    from mart.graph.report_data import CURVES, curve_panels, load_run

    opts = TuneOptions(backend="sim", backend_options={"scenario": "qwen2.5-3b-debate-2x2", "seed": 0, "clock": "poll"},
                       approve="auto", runs_dir=str(tmp_path), quiet=True, watch_interval_s=0.001, system_trials=1,
                       learning_trials=2, learning_horizon=10, learning_confirm_trials=0, report=True,
                       system_remeasure_share=0.25)
    run = tune(opts)["run_id"]
    db = sqlite3.connect(tmp_path / run / "mart.sqlite")
    keys = {k for (k,) in db.execute("select distinct m.key from metrics m join trials t on t.trial_id = m.trial_id "
                                     "where t.stage = 'learning' and m.value is not null")}
    logged = [title for title, prefixes in CURVES if any(k.startswith(p) for p in prefixes for k in keys)]
    assert len(logged) < len(CURVES), "precondition: a team logs fewer team-level curves"
    assert curve_panels(load_run(tmp_path / run)) == logged
    assert f"Learning curves: {', '.join(logged)} (" in (tmp_path / run / "report.html").read_text()
