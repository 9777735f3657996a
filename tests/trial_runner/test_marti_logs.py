"""MARTI's console output -> step records: lines in the format of MARTI's logger and trainer
(``marti/utils/logging_utils.py``, ``MultiAgent_PPOTrainer.fit`` / ``evaluate``), incl. Ray prefixes and colours."""

from __future__ import annotations

import math

from mart.trial_runner.marti.logs import (
    LogContext,
    MartiLogParser,
    MartiLogTail,
    MartiTextTail,
    find_oom,
    parse_status_dict,
)

P = "(MultiAgent_PPOTrainer pid=4242) "


def line(level: str, hms: str, msg: str, prefix: str = P) -> str:
    return f"{prefix}{level} 12-01 {hms} multi_agent_ppotrainer.py:100] {msg}\n"


def step_lines(step: int, t0: int, agents=(0, 1), with_id: bool = True, extra: str = "") -> list[str]:
    """One step as MARTI prints it: phase lines, then one status dict per trained agent."""
    m = lambda s: f"10:{(t0 + s) // 60:02d}:{(t0 + s) % 60:02d}"  # noqa: E731
    out = [line("INFO", m(0), "[MultiAgent_PPOTrainer] Begin ROLLOUT"),
           line("INFO", m(20), "[MultiAgent_PPOTrainer] ROLLOUT FINISHED! Begin making experiences"),
           line("INFO", m(25), "[MultiAgent_PPOTrainer] make_experience FINISHED! Begin Training")]
    for a in agents:
        aid = f"'agent_id': {float(a)}, " if with_id else ""
        out.append(line("WARNING", m(40), f"✨ Global step {step}: {{'policy_loss': 0.01, 'actor_lr': 1e-06, "
                                          f"{aid}'reward': {0.5 + a / 10}, 'response_length': 300.0, "
                                          f"'total_length': 500.0, 'kl': nan, 'ppo_clip_ratio': 0.0{extra}}}"))
    return out


def feed(parser: MartiLogParser, lines: list[str]):
    out = []
    for x in lines:
        out += parser.feed(x)
    return out


def test_a_step_is_emitted_at_the_next_boundary_with_verl_names_and_phases():
    ctx = LogContext(gpus=2, samples_per_agent_step=64, agent_order=[0, 1])
    p = MartiLogParser(ctx)
    assert feed(p, step_lines(1, 0)) == []  # the step may still get its evaluation
    recs = feed(p, step_lines(2, 60)[:1])
    assert [r.step for r in recs] == [1]
    d = recs[0].data
    assert d["agent0/critic/rewards/mean"] == 0.5 and d["agent1/critic/rewards/mean"] == 0.6
    assert math.isclose(d["critic/rewards/mean"], 0.55) and math.isclose(d["critic/score/mean"], 0.55)
    assert d["agent1/actor/pg_loss"] == 0.01 and d["actor/lr"] == 1e-6 and math.isnan(d["agent0/actor/kl_loss"])
    assert d["agent0/prompt_length/mean"] == 200.0 and d["response_length/mean"] == 300.0
    assert (d["timing_s/gen"], d["timing_s/make_experience"], d["timing_s/update_actor"], d["timing_s/step"]) == \
        (20.0, 5.0, 15.0, 40.0)
    tokens = 2 * 500.0 * 64  # both agents' mean total length x experiences per agent
    assert d["perf/total_num_tokens"] == tokens and d["perf/throughput"] == tokens / (40.0 * 2)
    assert d["agent0/marti/agent_id"] == 0.0


def test_agent_without_id_takes_its_place_in_the_context_order():
    p = MartiLogParser(LogContext(agent_order=[1, 2]))  # agent 0 is not tuned: the lines are agents 1, 2
    feed(p, step_lines(1, 0, agents=(7, 8), with_id=False))
    (rec,) = p.flush()
    assert {"agent1/critic/rewards/mean", "agent2/critic/rewards/mean"} <= set(rec.data)


def test_evaluation_joins_its_step_and_the_system_score_comes_first():
    p = MartiLogParser()
    feed(p, step_lines(3, 0))
    # with wandb, MARTI prints every agent's keys with eval/ and the all-agent mean
    p.feed(line("INFO", "10:01:00", "✨ Evaluation completed, global_step 3, eval_metrics: {'eval/eval_agent0_MATH_pass4'"
                                    ": 0.7, 'eval/eval_agent0_MATH_pass1': 0.4, 'eval/eval_agent1_MATH_pass1': 0.5, "
                                    "'eval/eval_allagent_MATH_pass1': 0.45, 'global_step': 3}"))
    (rec,) = p.flush()
    vals = [k for k in rec.data if k.startswith("val-core/")]
    assert vals[0] == "val-core/MATH/pass1" and rec.data[vals[0]] == 0.45
    assert rec.data["agent0/val-aux/MATH/pass4"] == 0.7 and rec.data["agent1/val-core/MATH/pass1"] == 0.5


def test_without_wandb_the_printed_agents_are_averaged_and_step_0_stands_alone():
    p = MartiLogParser()
    recs = p.feed(line("INFO", "09:59:00", "✨ Evaluation completed, global_step 0, eval_metrics: "
                                           "{'eval_agent1_AIME_pass1': 0.25}"))
    assert [r.step for r in recs] == [0] and recs[0].data == {"val-core/AIME/pass1": 0.25,
                                                              "agent1/val-core/AIME/pass1": 0.25}


def test_each_step_once_and_never_past_the_horizon():
    p = MartiLogParser(horizon=2)
    lines = step_lines(1, 0) + step_lines(2, 60) + step_lines(3, 120)
    recs = feed(p, lines) + p.flush()
    assert [r.step for r in recs] == [1, 2]
    assert feed(p, step_lines(1, 0)) + p.flush() == []  # echoed again: not returned twice


def test_ray_prefix_and_colours_are_stripped_and_junk_is_ignored():
    p = MartiLogParser()
    colored = [f"\x1b[36m{x}\x1b[0m" if "Global" in x else x for x in step_lines(1, 0)]
    feed(p, ["(raylet) [2026-12-01 10:00:00] some noise\n", "Episode [1/1]:  10%|#   | 1/10\n", *colored])
    (rec,) = p.flush()
    assert rec.step == 1 and rec.data["agent1/critic/rewards/mean"] == 0.6


def test_status_dict_values():
    d = parse_status_dict("{'a': 1.5, 'b': nan, 'c': tensor(0.25, device='cuda:0'), 'd': 'text', 'e': [1, 2], "
                          "'f': -inf, 'g': True, 'h': 3}")
    assert d["a"] == 1.5 and math.isnan(d["b"]) and d["c"] == 0.25 and d["f"] == -math.inf and d["g"] == 1.0
    assert d["h"] == 3.0 and "d" not in d and "e" not in d


def test_sub_second_steps_have_no_throughput():
    """MARTI's timestamps have 1 s resolution: a step inside one second has no measurable time."""
    p = MartiLogParser(LogContext(samples_per_agent_step=8))
    lines = [x.replace("10:00:20", "10:00:00").replace("10:00:25", "10:00:00").replace("10:00:40", "10:00:00")
             for x in step_lines(1, 0)]
    feed(p, lines)
    (rec,) = p.flush()
    assert rec.data["timing_s/step"] == 0.0 and "perf/throughput" not in rec.data


def test_file_tail_reads_complete_lines_incrementally(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text("=== mart: launch\n")
    tail = MartiLogTail(log, offset=log.stat().st_size)
    lines = step_lines(1, 0) + step_lines(2, 60)
    with open(log, "a") as f:
        f.write("".join(lines[:-1]) + lines[-1][:30])  # the last line half written
    assert [r.step for r in tail.read_new()] == [1]
    with open(log, "a") as f:
        f.write(lines[-1][30:])
    assert tail.read_new() == []  # step 2 waits for its boundary...
    assert [r.step for r in tail.read_new(final=True)] == [2]  # ...or the end of the run


def test_text_tail_over_a_growing_job_log():
    text = ["".join(step_lines(1, 0))]
    tail = MartiTextTail(lambda: text[0])
    assert tail.read_new() == []
    text[0] += "".join(step_lines(2, 60))
    assert [r.step for r in tail.read_new()] == [1]
    assert [r.step for r in tail.read_new(final=True)] == [2]


def test_oom_inside_a_ray_actor_is_found():
    text = ("(PolicyModelActor pid=11) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::PolicyModelActor.fit()\n")
    assert "CUDA out of memory" in find_oom(text)


def test_a_step_sampled_twice_adds_both_rollouts():
    """With dynamic_filtering_for_agents MARTI samples again until every agent has enough experiences."""
    p = MartiLogParser()
    feed(p, [line("INFO", "10:00:00", "[MultiAgent_PPOTrainer] Begin ROLLOUT"),
             line("INFO", "10:00:10", "[MultiAgent_PPOTrainer] ROLLOUT FINISHED! Begin making experiences"),
             line("INFO", "10:00:12", "[Agent 1] filtered_samples 8.00 < rollout_batch_size 16, continue sampling"),
             line("INFO", "10:00:15", "[MultiAgent_PPOTrainer] Begin ROLLOUT"),
             line("INFO", "10:00:30", "[MultiAgent_PPOTrainer] ROLLOUT FINISHED! Begin making experiences"),
             line("INFO", "10:00:33", "[MultiAgent_PPOTrainer] make_experience FINISHED! Begin Training"),
             line("WARNING", "10:00:50", "✨ Global step 1: {'agent_id': 0.0, 'reward': 0.5}")])
    (rec,) = p.flush()
    d = rec.data
    assert (d["timing_s/gen"], d["timing_s/make_experience"], d["timing_s/update_actor"], d["timing_s/step"]) == \
        (25.0, 8.0, 17.0, 50.0)
    assert d["marti/rollouts_per_step"] == 2.0
