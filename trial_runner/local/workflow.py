"""Pure functions of the multi-agent workflows: prompts, the final answer, reward shaping, health signals.

Debate (Du et al. 2023, as MARTI trains it): in round 0 every agent answers the task prompt alone; in
round r >= 1 agent i sees the other agents' round r-1 answers appended to its prompt and answers again.
The final answer is the majority of the last round's answers (a tie: the last agent's answer).
Chain: agent 0 drafts from the task prompt; agent i >= 1 sees agent i-1's answer and revises it; the
final answer is the last agent's.

A peer's answer is shown as tokens: ``<bos> digits <sep> answer_1 <sep> [answer_2 <sep>]``, each answer
without its <eos> and cut to ``cap`` tokens. All functions here work on token lists; nothing is random.

Reward shaping (MARTI, "influence-aware"): an answer's reward R is the centralized verifier's score of
that answer (the task's own rule-based reward, the same verifier for every agent); the shaped reward is
``R + alpha * Delta`` with ``Delta = R - Q`` (margin) or ``Q*R - (1-Q)*(1-R)`` (quality). Q is the mean
verifier score of the answers of the ``history_scope`` turns before this one in the same episode (the
answers the agent built on: in a debate the previous round's answers of every agent, in a chain the
previous agents' answers); the first turn has no history and is not shaped (Delta = 0).
Why per episode and not a per-agent running mean over past steps: a Q that is constant within a GRPO
group shifts and scales every reward of the group alike (margin: (1+alpha)R - alpha*Q; quality reduces to
R + alpha*(R + Q - 1)), so group normalisation would erase it; a Q that varies per episode does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mart.trial_runner.local.task import BOS, EOS, SEP

Answer = list[int]


def content(answer: Sequence[int]) -> list[int]:
    """The answer's tokens without its <eos>."""
    return list(answer[:-1]) if answer and answer[-1] == EOS else list(answer)


def peer_prompt(digits: Sequence[int], peers: Sequence[Sequence[int]], cap: int) -> list[int]:
    """The task prompt followed by each peer answer (cut to ``cap`` tokens) and a <sep>."""
    out = [BOS, *digits, SEP]
    for a in peers:
        out += [*content(a)[:cap], SEP]
    return out


def majority(answers: Sequence[Sequence[int]]) -> int:
    """Index of the final answer among the agents' last answers: the most frequent one (the last agent
    holding it); a tie between different answers goes to the last agent."""
    keys = [tuple(a) for a in answers]
    counts = Counter(keys)
    top = max(counts.values())
    winners = {k for k, c in counts.items() if c == top}
    if len(winners) > 1:
        return len(answers) - 1
    (win,) = winners
    return max(i for i, k in enumerate(keys) if k == win)


def shaping_delta(r: float, q: float, mode: str) -> float:
    """MARTI's shaping term: margin R - Q, quality Q*R - (1-Q)*(1-R); none 0."""
    if mode == "margin":
        return r - q
    if mode == "quality":
        return q * r - (1.0 - q) * (1.0 - r)
    if mode == "none":
        return 0.0
    raise ValueError(f"unknown shaping mode {mode!r}")


def shaped_reward(r: float, q: float | None, mode: str, alpha: float) -> float:
    """R + alpha * Delta(R, Q); no history (``q`` None) leaves R unshaped."""
    return r if q is None else r + alpha * shaping_delta(r, q, mode)


def history_q(turn_scores: Sequence[Sequence[float]], t: int, scope: int) -> float | None:
    """Q of turn ``t``: the mean score of every answer in turns max(0, t-scope) .. t-1 (None when t = 0).

    ``turn_scores[u]`` holds the verifier scores of the answers of turn u of one episode (debate: one per
    agent; chain: the one answer of agent u)."""
    past = [s for u in range(max(0, t - scope), t) for s in turn_scores[u]]
    return sum(past) / len(past) if past else None


def answer_changed(prev: Sequence[int], new: Sequence[int]) -> bool:
    return list(prev) != list(new)


def reward_shares(positive_sums: Sequence[float]) -> list[float]:
    """Each agent's share of the team's positive shaped reward (all 0 when there is none)."""
    total = sum(positive_sums)
    return [s / total if total > 0 else 0.0 for s in positive_sums]
