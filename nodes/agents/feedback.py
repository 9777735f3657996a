"""Reading a reviewer's free-text feedback into constraints the rules proposer can follow.

"don't touch gradient checkpointing; increase max_num_seqs" -> avoid {...checkpointing}, up {...max_num_seqs}.
A knob is recognised by its full key, its last segment, or that segment without ``enable_``/``use_`` and
with spaces for underscores. Intent words are looked up in the clause that names the knob.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mart.state.search_space import SearchSpace

AVOID = ("don't", "dont", "do not", "not ", "no ", "avoid", "keep", "leave", "never", "stop changing", "without")
UP = ("increase", "raise", "higher", "larger", "bigger", "more", "double", "up ")
DOWN = ("decrease", "reduce", "lower", "smaller", "less", "halve", "down ", "cut")
SAFE_MEMORY = ("memory", "oom", "safer", "conservative", "risky", "too aggressive")


@dataclass
class FeedbackRules:
    avoid: set[str] = field(default_factory=set)
    up: set[str] = field(default_factory=set)
    down: set[str] = field(default_factory=set)
    prefer_low_memory: bool = False
    focus: set[str] = field(default_factory=set)
    """Knobs the reviewer explicitly asked to move (preferred over all others)."""

    def allows(self, key: str, direction: str) -> bool:
        if key in self.avoid:
            return False
        if key in self.up and direction != "up":
            return False
        if key in self.down and direction != "down":
            return False
        return True


def _aliases(key: str) -> set[str]:
    last = key.rsplit(".", 1)[-1].lower()
    short = re.sub(r"^(enable_|use_)", "", last)
    names = {key.lower(), last, short, last.replace("_", " "), short.replace("_", " ")}
    # the words a person would use: "micro batch" for ppo_micro_batch_size_per_gpu
    core = [w for w in short.split("_") if w not in FILLER]
    if core:
        names.add(" ".join(core))
    return {n for n in names if len(n) >= 4}


FILLER = {"ppo", "per", "gpu", "size", "log", "prob", "enable", "use"}


def parse_feedback(texts: list[str], space: SearchSpace) -> FeedbackRules:
    rules = FeedbackRules()
    aliases = {p.key: _aliases(p.key) for p in space.params}
    for text in texts:
        if text.startswith("critic:"):
            continue  # the critic's reasons quote knob names; they are not a reviewer's intent
        for clause in re.split(r"[.;\n]|,| but | and ", text.lower()):
            clause = f" {clause.strip()} "
            if not clause.strip():
                continue
            mentioned = [k for k, names in aliases.items() if any(n in clause for n in names)]
            # the longest alias wins when one knob's name contains another's
            if len(mentioned) > 1:
                best_len = {k: max(len(n) for n in aliases[k] if n in clause) for k in mentioned}
                mentioned = [k for k in mentioned if not any(
                    best_len[o] > best_len[k] and any(n in o for n in aliases[k]) for o in mentioned if o != k)]
            if any(w in clause for w in SAFE_MEMORY) and not mentioned:
                rules.prefer_low_memory = True
            for key in mentioned:
                if any(w in clause for w in AVOID):
                    rules.avoid.add(key)
                elif any(w in clause for w in DOWN):
                    rules.down.add(key)
                    rules.focus.add(key)
                elif any(w in clause for w in UP):
                    rules.up.add(key)
                    rules.focus.add(key)
                else:
                    rules.focus.add(key)
    return rules
