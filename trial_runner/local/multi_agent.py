"""The multi-agent trainer of the local workload: 2-3 tiny policies in a debate or a chain (MARTI-style).

Each agent is a full single-agent trainer (``GRPOTrainer``: its own actor, frozen reference, AdamW and
sampling stream, started from the same cached base model) with its own knobs (lr, KL and entropy
coefficients, temperature) and seed. One step, phase by phase (timed like the single-agent step):

    gen           the workflow's rollout: every turn of every agent (debate: all rounds; chain: all agents)
    reward        the verifier on every answer and on the final answer; per-agent shaping (workflow.py)
    old_log_prob  each agent's forward over its own answers
    ref           each agent's reference forward (with use_kl_loss)
    adv           GRPO advantages per agent, grouped by prompt and turn (the rollout.n episodes of a
                  prompt form the group of each turn: same task, same position in the workflow)
    update_actor  one GRPO update per agent on its own answers of every turn (debate: all rounds, so
                  round 0 learns to answer alone and later rounds learn to use the others' answers)

The agents run one after another in one process, so memory is the sum of the agents' weights, optimizer
states and references plus the largest single activation peak (one agent's forward/backward at a time).
On GPUs MARTI places each agent on its own GPUs (one node per agent in the paper) or colocates them;
see docs/backends.md.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mart.state.search_space import ConfigError
from mart.trial_runner.local import task as T
from mart.trial_runner.local import workflow as W
from mart.trial_runner.local.checkpoint import CHECKPOINT_FILE, SHAPE_KEYS, _as_rng_state
from mart.trial_runner.local.config import LocalConfig
from mart.trial_runner.local.grpo import (
    GRPOTrainer,
    Timer,
    advantage_token_mean,
    grpo_advantages,
    task_config,
)
from mart.trial_runner.local.rollout import generate
from mart.trial_runner.local.team_config import TeamConfig


class AgentTrainer(GRPOTrainer):
    """One agent: a GRPO trainer whose prompts may carry the other agents' answers."""

    def __init__(self, cfg: LocalConfig, base_state: dict, device: torch.device, total_steps: int,
                 prompt_cap: int, turns: int) -> None:
        super().__init__(cfg, base_state, device, total_steps)
        self.prompt_cap = prompt_cap
        self.opt_steps_per_step *= turns  # one mini-batch pass per turn's answers
        self.total_opt_steps = total_steps * self.opt_steps_per_step

    def _pads(self) -> tuple[int | None, int | None]:
        c = self.cfg
        return (None, None) if c.use_remove_padding else (self.prompt_cap, c.max_response_length)


@dataclass
class Slot:
    """The answers of one agent at one turn, one per episode."""

    agent: int
    turn: int
    prompts: list[list[int]]
    responses: list[list[int]]


@dataclass
class Episodes:
    slots: list[Slot]
    final: list[list[int]]  # the team's final answer per episode
    turns: int


class TeamTrainer:
    """The agents, the shared prompt stream and the workflow of one multi-agent trial."""

    def __init__(self, team: TeamConfig, base_state: dict, device: torch.device, total_steps: int) -> None:
        self.team, self.cfg, self.device = team, team.base, device
        self.task = task_config(team.base)
        self.agents = [AgentTrainer(a, base_state, device, total_steps, team.max_prompt_tokens, team.turns)
                       for a in team.agents]
        self.rng = random.Random(team.base.seed)  # prompt order (shared: every agent works on the same task)
        self.val_digits = T.val_set(self.task)
        self.last_num_responses = 0

    @property
    def probe(self):
        return self.agents[0].probe

    @probe.setter
    def probe(self, fn) -> None:
        for a in self.agents:
            a.probe = fn

    # --- the workflow -----------------------------------------------------------------------------------
    def _generate(self, agent: AgentTrainer, prompts: list[list[int]], generator: torch.Generator | None,
                  temperature: float) -> list[list[int]]:
        c = agent.cfg
        agent.actor.eval()
        out = generate(agent.actor, prompts, c.max_response_length, max_num_seqs=c.max_num_seqs,
                       temperature=temperature, top_p=c.top_p if generator is not None else 1.0, generator=generator)
        return [r if r else [T.EOS] for r in out]

    def rollout(self, digits: list[list[int]], generators: list[torch.Generator | None],
                temperatures: list[float]) -> Episodes:
        """Run the workflow on every episode (one per entry of ``digits``)."""
        t, cap = self.team, self.team.peer_answer_tokens
        plain = [T.encode_prompt(d) for d in digits]
        slots: list[Slot] = []
        if t.workflow == "debate":
            prev: list[list[list[int]]] = []
            for r in range(t.num_rounds):
                now = []
                for i, agent in enumerate(self.agents):
                    prompts = plain if r == 0 else [
                        W.peer_prompt(d, [prev[j][k] for j in range(t.num_agents) if j != i], cap)
                        for k, d in enumerate(digits)]
                    resp = self._generate(agent, prompts, generators[i], temperatures[i])
                    slots.append(Slot(i, r, prompts, resp))
                    now.append(resp)
                prev = now
            final = [prev[W.majority([prev[i][k] for i in range(t.num_agents)])][k] for k in range(len(digits))]
            return Episodes(slots, final, t.num_rounds)
        last: list[list[int]] = []
        for i, agent in enumerate(self.agents):  # chain
            prompts = plain if i == 0 else [W.peer_prompt(d, [last[k]], cap) for k, d in enumerate(digits)]
            last = self._generate(agent, prompts, generators[i], temperatures[i])
            slots.append(Slot(i, i, prompts, last))
        return Episodes(slots, last, t.num_agents)

    def _scores(self, ep: Episodes, digits: list[list[int]]) -> list[list[float]]:
        return [[T.score(d, r) for d, r in zip(digits, s.responses)] for s in ep.slots]

    def _shape(self, ep: Episodes, scores: list[list[float]]) -> list[list[float]]:
        """Shaped reward of every answer (per slot, per episode)."""
        t = self.team
        n_ep = len(scores[0])
        shaped = []
        for s, sc in zip(ep.slots, scores):
            row = []
            for k in range(n_ep):
                by_turn = [[scores[j][k] for j, o in enumerate(ep.slots) if o.turn == u] for u in range(ep.turns)]
                q = W.history_q(by_turn, s.turn, t.history_scope)
                row.append(W.shaped_reward(sc[k], q, t.shaping_mode, t.shaping_alpha))
            shaped.append(row)
        return shaped

    def _health(self, ep: Episodes) -> dict[str, float]:
        """workflow/answer_change_rate, workflow/agreement, agent<i>/copy_rate."""
        t = self.team
        by = {(s.agent, s.turn): s.responses for s in ep.slots}
        n_ep = len(ep.final)
        changed = total = 0
        copies = [0] * t.num_agents
        seen = [0] * t.num_agents
        for s in ep.slots:
            if s.turn == 0:
                continue
            if t.workflow == "debate":
                own_prev = by[(s.agent, s.turn - 1)]
                peers_prev = [by[(j, s.turn - 1)] for j in range(t.num_agents) if j != s.agent]
            else:  # a chain agent's "previous answer" is the one it revises
                own_prev = by[(s.agent - 1, s.turn - 1)]
                peers_prev = [own_prev]
            for k in range(n_ep):
                changed += W.answer_changed(own_prev[k], s.responses[k])
                total += 1
                copies[s.agent] += any(list(p[k]) == list(s.responses[k]) for p in peers_prev)
                seen[s.agent] += 1
        last_turn = [s for s in ep.slots if s.turn == ep.turns - 1] if t.workflow == "debate" else ep.slots
        agree = sum(len({tuple(s.responses[k]) for s in last_turn}) == 1 for k in range(n_ep)) / n_ep
        out = {"workflow/answer_change_rate": changed / total if total else 0.0, "workflow/agreement": agree}
        for i in range(t.num_agents):
            out[f"agent{i}/copy_rate"] = copies[i] / seen[i] if seen[i] else 0.0
        return out

    # --- one step -----------------------------------------------------------------------------------------
    def step(self, timer: Timer) -> dict[str, float]:
        c, dev, t = self.cfg, self.device, self.team
        n = c.rollout_n
        digits = [T.sample_digits(self.rng, self.task, "train") for _ in range(c.train_batch_size)]
        digits = [d for d in digits for _ in range(n)]  # interleaved repeat: a group is n consecutive episodes

        with timer.phase("gen"):
            ep = self.rollout(digits, [a.sampler for a in self.agents], [a.cfg.temperature for a in self.agents])
        with timer.phase("reward"):
            scores = self._scores(ep, digits)
            shaped = self._shape(ep, scores)
            team_scores = torch.tensor([T.score(d, r) for d, r in zip(digits, ep.final)])

        # each agent's batch: its slots in turn order (so groups of n stay within one prompt and turn)
        batches = []
        for i in range(t.num_agents):
            mine = [j for j, s in enumerate(ep.slots) if s.agent == i]
            prompts = [p for j in mine for p in ep.slots[j].prompts]
            responses = [r for j in mine for r in ep.slots[j].responses]
            rewards = torch.tensor([x for j in mine for x in shaped[j]], device=dev)
            lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
            R = max(len(r) for r in responses)
            mask = torch.zeros(len(responses), R, device=dev)
            for k, r in enumerate(responses):
                mask[k, : len(r)] = 1.0
            batches.append({"prompts": prompts, "responses": responses, "rewards": rewards, "lengths": lengths,
                            "mask": mask})

        with timer.phase("old_log_prob"):
            for agent, b in zip(self.agents, batches):
                b["old"], b["ent"] = agent._log_probs(agent.actor, b["prompts"], b["responses"], b["lengths"],
                                                      agent.cfg.rollout_log_prob_micro_batch_size_per_gpu, True)
        if c.use_kl_loss:
            with timer.phase("ref"):
                for agent, b in zip(self.agents, batches):
                    b["ref"], _ = agent._log_probs(agent.ref, b["prompts"], b["responses"], b["lengths"],
                                                   agent.cfg.ref_log_prob_micro_batch_size_per_gpu, False)
        with timer.phase("adv"):
            for agent, b in zip(self.agents, batches):
                b["adv"] = grpo_advantages(b["rewards"], n, agent.cfg.norm_adv_by_std_in_grpo)
        with timer.phase("update_actor"):
            for agent, b in zip(self.agents, batches):
                b["upd"] = agent._update(b["prompts"], b["responses"], b["lengths"], b["mask"], b["old"],
                                         b.get("ref"), b["adv"])

        metrics: dict[str, float] = {}
        positive = []
        for i, b in enumerate(batches):
            p = f"agent{i}/"
            m = b["mask"]
            metrics[p + "actor/entropy"] = float((b["ent"] * m).sum() / m.sum())
            metrics.update({p + k: v for k, v in b["upd"].items()})
            metrics[p + "critic/score/mean"] = float(b["rewards"].mean())
            metrics[p + "critic/advantages/mean"] = advantage_token_mean(b["adv"], m)
            metrics[p + "response_length/mean"] = float(m.sum(-1).mean())
            mine = [j for j, s in enumerate(ep.slots) if s.agent == i]
            metrics[p + "verifier/score/mean"] = sum(sum(scores[j]) for j in mine) / (len(mine) * len(digits))
            positive.append(float(b["rewards"].clamp(min=0).sum()))
        for i, share in enumerate(W.reward_shares(positive)):
            metrics[f"agent{i}/reward_share"] = share
        metrics.update(self._health(ep))
        all_len = torch.cat([b["mask"].sum(-1) for b in batches])
        prompt_len = torch.tensor([float(len(p)) for b in batches for p in b["prompts"]])
        self.last_num_responses = int(all_len.numel())
        metrics.update({
            "critic/score/mean": float(team_scores.mean()),
            "critic/score/max": float(team_scores.max()),
            "critic/score/min": float(team_scores.min()),
            "critic/rewards/mean": float(team_scores.mean()),
            "response_length/mean": float(all_len.mean()),
            "response_length/max": float(all_len.max()),
            "response_length/min": float(all_len.min()),
            "response_length/clip_ratio": float((all_len >= c.max_response_length).float().mean()),
            "prompt_length/mean": float(prompt_len.mean()),
            "prompt_length/max": float(prompt_len.max()),
            "prompt_length/min": float(prompt_len.min()),
            "perf/total_num_tokens": int(sum(sum(b["lengths"]) for b in batches)),
        })
        return metrics

    # --- validation -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """The team's score on the held-out prompts (greedy unless val_kwargs.do_sample), and each agent's
        own last answer's score within the team (``val-aux/<task>/agent<i>/reward/mean@1``)."""
        c = self.cfg
        gens = [torch.Generator().manual_seed(a.val_sampler_seed) if c.val_do_sample else None for a in self.agents]
        temps = [c.val_temperature or 1.0] * len(self.agents)
        digits = self.val_digits
        ep = self.rollout(digits, gens, temps)
        team = [T.score(d, r) for d, r in zip(digits, ep.final)]
        name, N = self.task.name, len(digits)
        out = {
            f"val-core/{name}/reward/mean@1": sum(team) / N,
            f"val-aux/{name}/exact/mean@1": sum(s == 1.0 for s in team) / N,
            f"val-aux/{name}/response_length/mean": sum(len(r) for r in ep.final) / N,
        }
        for i in range(self.team.num_agents):
            last = max((s for s in ep.slots if s.agent == i), key=lambda s: s.turn)
            out[f"val-aux/{name}/agent{i}/reward/mean@1"] = sum(T.score(d, r) for d, r in zip(digits, last.responses)) / N
        return out


# --- checkpoints (every agent's state) ----------------------------------------------------------------------
TEAM_SHAPE_KEYS = ("workflow.name", "workflow.num_agents")


def save_team_checkpoint(trainer: TeamTrainer, step: int, directory: str | os.PathLike,
                         flat_config: dict[str, Any]) -> Path:
    """Every agent's weights, AdamW state, schedule position and sampling stream, plus the shared prompt
    stream, in one file written atomically (as ``checkpoint.save_checkpoint``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": 1,
        "team": True,
        "step": int(step),
        "seed": int(trainer.cfg.seed),
        "rng": trainer.rng.getstate(),
        "agents": [{"model": a.actor.state_dict(), "optimizer": a.opt.state_dict(), "opt_step": int(a.opt_step),
                    "sampler": a.sampler.get_state()} for a in trainer.agents],
        "config": {k: flat_config.get(k) for k in (*SHAPE_KEYS, *TEAM_SHAPE_KEYS)},
    }
    path = out / CHECKPOINT_FILE
    tmp = out / (CHECKPOINT_FILE + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_team_checkpoint(trainer: TeamTrainer, directory: str | os.PathLike, flat_config: dict[str, Any]) -> int:
    """Restore every agent; returns the global step. The branch's own per-agent knobs then apply.

    Raises:
        ConfigError: no checkpoint, a single-agent checkpoint, or a change of the model's shape, the
            workflow or the number of agents.
    """
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise ConfigError(f"`init_from`: no checkpoint at {path} (a step the parent saved? see save_steps).")
    state = torch.load(path, map_location=trainer.device, weights_only=True)
    if not state.get("team"):
        raise ConfigError("`init_from`: a single-agent checkpoint cannot start a multi-agent trial.")
    keys = (*SHAPE_KEYS, *TEAM_SHAPE_KEYS)
    changed = [k for k in keys if state["config"].get(k) != flat_config.get(k)]
    if changed:
        raise ConfigError("a branch cannot change the model's shape or the team: "
                          + ", ".join(f"`{k}` {state['config'].get(k)!r} -> {flat_config.get(k)!r}" for k in changed))
    step = int(state["step"])
    same_seed = int(state["seed"]) == trainer.cfg.seed
    for i, (agent, saved) in enumerate(zip(trainer.agents, state["agents"])):
        agent.actor.load_state_dict(saved["model"])
        agent.opt.load_state_dict(saved["optimizer"])
        for group in agent.opt.param_groups:
            group["weight_decay"] = agent.cfg.weight_decay
            group["lr"] = agent.cfg.lr
        agent.opt_step = int(saved["opt_step"])
        if same_seed:
            agent.sampler.set_state(saved["sampler"])
        else:
            agent.sampler = torch.Generator().manual_seed(agent.cfg.seed * 1_000_003 + step)
    if same_seed:
        trainer.rng.setstate(_as_rng_state(state["rng"]))
    else:
        trainer.rng = random.Random(trainer.cfg.seed * 1_000_003 + step)
    return step
