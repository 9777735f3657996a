"""The embedded task: sort a string of digits. Verifiable, shipped with the code, no downloads.

Prompt:   <bos> 3 1 4 1 5 <sep>        (3..10 digits by default)
Response: 1 1 3 4 5 <eos>              (the same digits, ascending)

The answer is as long as the prompt, so response lengths vary per prompt, and a policy that has not
learnt to count stops too early or rambles on to ``data.max_response_length`` (``response_length/*``
and the rollout cost drift as it learns when to stop). The reward is rule based with partial credit.

Splits are disjoint by construction: a digit string belongs to the held-out validation split when
its CRC32 is divisible by ``VAL_MODULUS``, to the train split otherwise.

``digit_sort_long`` (issue 24) is the same task where answers need more tokens as the policy improves and the
length limit binds, as reasoning responses lengthen under GRPO and get cut at ``data.max_response_length``:
the base model also stops too early (a share ``SHORT_PROB`` of its demonstrations leave out the last 1-3
digits), GRPO teaches it to finish, and a response cut at the limit before its <eos> scores 0 (verl's math
rewards score an unfinished solution 0). Under a limit shorter than the longest answer the policy must stop
early on long prompts (partial credit), and a longer limit lets it finish.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

# vocabulary: the ten digits are their own token ids
PAD, BOS, SEP, EOS = 10, 11, 12, 13
VOCAB_SIZE = 14
TASK_NAMES = ("digit_sort", "digit_sort_long")
SHORT_PROB = 0.5  # share of the long task's warm-up demonstrations that stop 1-3 digits short

VAL_MODULUS = 8  # 1 in 8 digit strings is held out for validation
VAL_SEED = 20_240_601  # the validation set is the same for every trial


@dataclass(frozen=True)
class TaskConfig:
    name: str = "digit_sort"
    min_digits: int = 3
    max_digits: int = 10
    val_size: int = 128

    @property
    def max_prompt_tokens(self) -> int:
        return self.max_digits + 2  # <bos> digits <sep>

    @property
    def max_answer_tokens(self) -> int:
        return self.max_digits + 1  # digits <eos>


def is_val(digits: list[int]) -> bool:
    return zlib.crc32(bytes(digits)) % VAL_MODULUS == 0


def sample_digits(rng: random.Random, cfg: TaskConfig, split: str) -> list[int]:
    """One digit string of the given split ("train" or "val")."""
    want_val = split == "val"
    while True:
        k = rng.randint(cfg.min_digits, cfg.max_digits)
        digits = [rng.randrange(10) for _ in range(k)]
        if is_val(digits) == want_val:
            return digits


def val_set(cfg: TaskConfig) -> list[list[int]]:
    """The fixed held-out validation prompts (same for every trial and seed)."""
    rng = random.Random(VAL_SEED)
    return [sample_digits(rng, cfg, "val") for _ in range(cfg.val_size)]


def encode_prompt(digits: list[int]) -> list[int]:
    return [BOS, *digits, SEP]


def target(digits: list[int]) -> list[int]:
    return sorted(digits)


def answer_tokens(digits: list[int]) -> list[int]:
    """The correct response."""
    return [*target(digits), EOS]


def demonstration(digits: list[int], rng: random.Random, ramble_prob: float, max_ramble: int) -> list[int]:
    """A warm-up demonstration: the answer, but with probability ``ramble_prob`` the last digit is
    repeated 1..``max_ramble`` extra times before <eos>. The base model inherits this habit (as a
    pretrained model carries habits a verifier penalises); GRPO has to learn when to stop."""
    answer = target(digits)
    if max_ramble > 0 and rng.random() < ramble_prob:
        answer = answer + [answer[-1]] * rng.randint(1, max_ramble)
    return [*answer, EOS]


def short_demonstration(digits: list[int], rng: random.Random, ramble_prob: float, max_ramble: int,
                        short_prob: float = SHORT_PROB) -> list[int]:
    """A warm-up demonstration of the long task: ``demonstration``, but with probability ``short_prob`` the
    answer stops 1-3 digits early (at least one digit stays): the habit of answering too briefly."""
    if rng.random() < short_prob and len(digits) > 1:
        answer = target(digits)
        return [*answer[: max(1, len(answer) - rng.randint(1, 3))], EOS]
    return demonstration(digits, rng, ramble_prob, max_ramble)


def task_demonstration(task: TaskConfig, digits: list[int], rng: random.Random, ramble_prob: float,
                       max_ramble: int) -> list[int]:
    if task.name == "digit_sort_long":
        return short_demonstration(digits, rng, ramble_prob, max_ramble)
    return demonstration(digits, rng, ramble_prob, max_ramble)


def task_score(task: TaskConfig, digits: list[int], response: list[int]) -> float:
    """The reward of ``response`` under ``task``'s rule: ``score``; in the long task 0 for a response cut at the
    limit (no <eos>: an unfinished answer)."""
    if task.name == "digit_sort_long" and (not response or response[-1] != EOS):
        return 0.0
    return score(digits, response)


def score(digits: list[int], response: list[int]) -> float:
    """Rule-based reward in [0, 1]: positions right over the longer of answer and response.

    ``response`` is the generated token list (up to and including <eos>, if it stopped). A correct,
    properly stopped answer scores 1.0; stopping early or rambling on lowers the score, as does
    each wrong digit.
    """
    if response and response[-1] == EOS:
        response = response[:-1]
    want = target(digits)
    hits = sum(1 for a, b in zip(want, response) if a == b)
    return hits / max(len(want), len(response), 1)
