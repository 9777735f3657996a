"""Stage 2's verdict is explained: when no change replaced the baseline although one led it on both seeds, the
summary says the lead, the bar it had to clear and the rule; the terminal and the report say "kept the baseline",
never a signed zero. The lead is recomputed from the ledger's scores; the bar is at least 2 standard errors of the
difference with the summary's noise."""

from __future__ import annotations

import math
import re

from mart.graph.session import tune
from mart.state.ledger import Ledger
from mart.state.objectives import Contender, baseline_verdict, learning_choice
from tests.support.cli import cli, sim_stage2_options


def test_the_verdict_names_the_lead_the_bar_and_the_rule():
    base = Contender("base", [0.50, 0.51], [], is_baseline=True)
    near = Contender("near", [0.52, 0.525], [])  # leads on both seeds by 0.0175; the bar is 2 x 0.01 x 1 = 0.02
    winner, _ = learning_choice([base, near], noise=0.01)
    assert winner is base
    text = baseline_verdict([base, near], noise=0.01)
    assert "near led the baseline on both seeds by +0.0175" in text
    assert "below the bar 0.0200" in text and "two seeds" in text and "2 standard errors" in text
    # a change that ran once is not evidence, and the verdict says so
    once = Contender("once", [0.60], [])
    assert "one run" in baseline_verdict([base, once], noise=0.01)


def test_a_sim_session_that_keeps_the_baseline_says_why_in_numbers(tmp_path):
    # seed 4 of this scenario: a change leads the defaults on both seeds, by less than the noise allows
    summary = tune(sim_stage2_options(tmp_path, seed=4, report=True))
    learn = summary["learning"]
    assert learn["kept_baseline"] and learn["score_gain"] == 0.0
    note = next(n for n in summary["notes"] if n.startswith("learning stage: no candidate beat the baseline"))
    m = re.search(r"(\S+) led the baseline on both seeds by ([+-]\d\.\d{4}) .* below the bar (\d\.\d{4})", note)
    assert m, note
    lead_id, lead, bar = m.group(1), float(m.group(2)), float(m.group(3))
    rows = Ledger.open(tmp_path / summary["run_id"]).trials("learning")

    def runs(trial_id):
        return [r["score"] for r in rows if trial_id in (r["trial_id"], r.get("confirms")) and r["status"] == "completed"]

    base_id = next(r["trial_id"] for r in rows if r["kind"] == "baseline")
    ours, theirs = runs(lead_id), runs(base_id)
    assert len(ours) == 2 and min(ours) > sum(theirs) / len(theirs)
    assert math.isclose(lead, sum(ours) / 2 - sum(theirs) / len(theirs), abs_tol=1e-4)
    assert lead < bar and bar >= 2 * learn["score_noise"] * math.sqrt(1 / 2 + 1 / len(theirs)) - 1e-4
    assert "rule:" in note and "two seeds" in note
    # the terminal's table and the report say it in words
    row = next(line for line in cli("resume", summary["run_id"], "--runs-dir", str(tmp_path)).stdout.splitlines()
               if "learning (val score)" in line)
    assert "kept the baseline" in row and "-0.0000" not in row and "+0.0000" not in row
    report = (tmp_path / summary["run_id"] / "report.html").read_text()
    assert "kept the baseline" in report and "-0.0000" not in report
