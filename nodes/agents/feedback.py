"""Reading a reviewer's free-text feedback into constraints the rules proposer can follow, and saying back how.

"keep it simple: try enforce_eager or chunked prefill" -> try enforce_eager, try chunked_prefill.
"don't touch max_num_seqs or the micro batch; raise the memory share" -> leave both alone, raise the share.

A knob is recognised by its full key, its short name (``micro_batch``), its last segment, those words with
spaces for underscores, or what its record says people call it (``ParamSpec.aliases``: "learning rate"; the
longest match wins when names overlap). Feedback is read phrase by phrase
(split at ``. ; : ! ?``, commas and "but"): an intent word applies to the knobs after it in its phrase until
another intent word (so a negation covers "X or Y"), and a knob with no intent before it takes the first
one after it ("micro batch higher"). A negation turns the verb after it around ("don't increase lr" forbids
raising lr; "don't touch X" leaves X alone); "anything but X" and "keep X" leave X alone.
``FeedbackRules.describe()`` is shown in the next review so a reviewer can correct a misreading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mart.nodes.knob_effects import knob_facts
from mart.state.search_space import SearchSpace

# intent words -> kind; multi-word phrases first (matched as whole words)
_INTENTS: list[tuple[str, str]] = [
    ("anything but", "avoid"), ("anything except", "avoid"), ("everything but", "avoid"),
    ("everything except", "avoid"), ("all but", "avoid"), ("hands off", "avoid"), ("stay away from", "avoid"),
    ("turn on", "up"), ("switch on", "up"), ("turn off", "down"), ("switch off", "down"),
    ("do not", "neg"), ("don't", "neg"), ("dont", "neg"), ("never", "neg"), ("not", "neg"), ("no", "neg"),
    ("without", "neg"), ("stop", "neg"),
    ("avoid", "avoid"), ("leave", "avoid"), ("keep", "avoid"), ("freeze", "avoid"),
    ("increase", "up"), ("raise", "up"), ("higher", "up"), ("larger", "up"), ("bigger", "up"), ("more", "up"),
    ("double", "up"), ("up", "up"), ("longer", "up"), ("grow", "up"), ("boost", "up"), ("enable", "up"),
    ("decrease", "down"), ("reduce", "down"), ("lower", "down"), ("smaller", "down"), ("less", "down"),
    ("fewer", "down"), ("shorter", "down"), ("halve", "down"), ("down", "down"), ("cut", "down"), ("shrink", "down"), ("disable", "down"),
    ("try", "try"), ("use", "try"), ("change", "try"), ("touch", "try"), ("move", "try"), ("modify", "try"),
    ("tune", "try"), ("adjust", "try"), ("consider", "try"), ("explore", "try"), ("focus on", "try"),
]
SAFE_MEMORY = ("memory", "oom", "safer", "conservative", "risky", "too aggressive")
FILLER = {"ppo", "per", "gpu", "size", "log", "prob", "enable", "use"}


@dataclass
class FeedbackRules:
    avoid: set[str] = field(default_factory=set)
    """Knobs to leave alone."""
    up: set[str] = field(default_factory=set)
    """Knobs to raise (numbers) or turn on (switches), and only that."""
    down: set[str] = field(default_factory=set)
    """Knobs to lower or turn off, and only that."""
    not_up: set[str] = field(default_factory=set)
    """Knobs that may move, but never up ("don't increase lr")."""
    not_down: set[str] = field(default_factory=set)
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
        if (key in self.not_up and direction == "up") or (key in self.not_down and direction == "down"):
            return False
        return True

    def describe(self, space: SearchSpace | None = None) -> list[str]:
        """How the feedback was read, one phrase per knob: "try enforce_eager", "leave max_num_seqs alone"."""
        name = space.edit_name if space is not None else (lambda k: k.rsplit(".", 1)[-1])

        def switch(key: str) -> bool:
            return space is not None and key in space and space[key].kind == "bool"

        out = []
        for key in sorted(self.up):
            out.append(f"{'turn on' if switch(key) else 'raise'} {name(key)}")
        for key in sorted(self.down):
            out.append(f"{'turn off' if switch(key) else 'lower'} {name(key)}")
        for key in sorted(self.focus - self.up - self.down):
            out.append(f"try {name(key)}")
        for key in sorted(self.not_up):
            out.append(f"don't raise {name(key)}")
        for key in sorted(self.not_down):
            out.append(f"don't lower {name(key)}")
        for key in sorted(self.avoid):
            out.append(f"leave {name(key)} alone")
        if self.prefer_low_memory:
            out.append("prefer configs that use less memory")
        return out


def _all_aliases(space: SearchSpace) -> dict[str, set[str]]:
    """key -> the names that point at it alone (a name several knobs share goes to none of them,
    unless it is exactly one knob's short name or synonym: "micro batch" is the update's micro batch)."""
    shorts = space.short_names()
    raw = {p.key: _aliases(p.key, shorts.get(p.key, p.key)) for p in space.params}
    preferred: dict[str, str] = {}
    for p in space.params:
        names = {shorts.get(p.key, ""), shorts.get(p.key, "").replace("_", " ")}
        names |= set(knob_facts(p).aliases)  # what people call the knob (its record), beside its key's names
        for n in names - {""}:
            preferred.setdefault(n, p.key)
            raw[p.key].add(n)
    owners: dict[str, list[str]] = {}
    for key, names in raw.items():
        for n in names:
            owners.setdefault(n, []).append(key)
    return {key: {n for n in names if len(owners[n]) == 1 or preferred.get(n) == key}
            for key, names in raw.items()}


def _aliases(key: str, short: str) -> set[str]:
    last = key.rsplit(".", 1)[-1].lower()
    stripped = re.sub(r"^(enable_|use_)", "", last)
    names = {key.lower(), last, stripped, short.lower()}
    names |= {n.replace("_", " ") for n in list(names)}
    # the words a person would use: "micro batch" for ppo_micro_batch_size_per_gpu
    core = [w for w in stripped.split("_") if w not in FILLER]
    if core:
        names.add(" ".join(core))
    # a dotted suffix people paste: rollout.gpu_memory_utilization
    parts = key.lower().split(".")
    names |= {".".join(parts[i:]) for i in range(1, len(parts) - 1)}
    return {n for n in names if len(n) >= 2 and n not in {"n", "up", "no"}}


def _find(pattern: str, text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"(?<![\w.])" + re.escape(pattern) + r"(?![\w])", text)]


def _mentions(clause: str, aliases: dict[str, set[str]]) -> list[tuple[int, int, str]]:
    """Knob mentions as (start, end, key); overlapping matches resolved in favour of the longest."""
    found = [(s, e, key) for key, names in aliases.items() for n in names for s, e in _find(n, clause)]
    found.sort(key=lambda m: (-(m[1] - m[0]), m[0]))
    taken: list[tuple[int, int, str]] = []
    for s, e, key in found:
        if all(e <= ts or s >= te for ts, te, _ in taken):
            taken.append((s, e, key))
    return sorted(taken)


def _intents(clause: str, spans: list[tuple[int, int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, int, str]] = []
    for phrase, kind in _INTENTS:
        for s, e in _find(phrase, clause):
            if any(s < me and e > ms for ms, me, _ in spans):
                continue  # a word inside a knob's name ("max_num_seqs" holds no intent)
            if all(e <= os_ or s >= oe for os_, oe, _ in out):
                out.append((s, e, kind))
    return sorted((s, kind) for s, _, kind in out)


def _combine(kind: str, negated: bool) -> str:
    if not negated:
        return kind
    return {"up": "not_up", "down": "not_down", "try": "avoid", "avoid": "avoid"}.get(kind, "avoid")


def parse_feedback(texts: list[str], space: SearchSpace) -> FeedbackRules:
    rules = FeedbackRules()
    aliases = _all_aliases(space)
    for text in texts:
        if text.startswith("critic:"):
            continue  # the critic's reasons quote knob names; they are not a reviewer's intent
        text = re.sub(r"^reviewer on [\w-]+:\s*", "", text)  # the prefix the review node adds
        # a dot ends a phrase only before a space: "rollout.gpu_memory_utilization" is one name
        for clause in re.split(r"\.(?=\s|$)|[;:!?\n,]+|\bbut\b", text.lower().replace("’", "'")):
            clause = clause.strip()
            if not clause:
                continue
            spans = _mentions(clause, aliases)
            intents = _intents(clause, spans)
            if not spans:
                if any(w in clause for w in SAFE_MEMORY):
                    rules.prefer_low_memory = True
                continue
            events = sorted([(s, "intent", kind) for s, kind in intents] + [(s, "knob", key) for s, _, key in spans])
            current: str | None = None
            negated = False
            pending: list[str] = []  # knobs seen before any intent: they take the first intent after them
            for i, (_, what, val) in enumerate(events):
                if what == "intent":
                    if val == "neg":
                        negated = True
                        continue
                    current = _combine(val, negated)
                    negated = False
                    for key in pending:
                        _apply(rules, key, current)
                    pending = []
                    continue
                if negated and current is None:  # "no X", "not X": leave it alone
                    _apply(rules, val, "avoid")
                elif current is None:
                    pending.append(val)
                else:
                    _apply(rules, val, current)
            for key in pending:  # a bare mention: the reviewer points at it
                _apply(rules, key, "try")
        # "anything but X" spans a "but": handle it on the whole text
        for m in re.finditer(r"\b(?:anything|everything|all)\s+(?:but|except)\s+([^.;:!?\n,]+)", text.lower()):
            for _, _, key in _mentions(m.group(1), aliases):
                _apply(rules, key, "avoid")
    return rules


def _apply(rules: FeedbackRules, key: str, kind: str) -> None:
    if kind == "avoid":
        rules.avoid.add(key)
        rules.focus.discard(key)
        rules.up.discard(key)
        rules.down.discard(key)
    elif kind in ("up", "down"):
        getattr(rules, kind).add(key)
        rules.focus.add(key)
    elif kind in ("not_up", "not_down"):
        getattr(rules, kind).add(key)
    else:
        rules.focus.add(key)
