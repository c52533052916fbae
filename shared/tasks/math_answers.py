"""The math verifier: the last \\boxed{...} of a completion against the reference answer, with math-verify
(`math_reward`); or, for models that rarely box an answer, the last boxed answer else the last number
(`number_reward`, math_gym's `answer_format = "number"`).

math-verify parses both sides into SymPy and compares them symbolically and numerically, so \\frac{1}{2},
0.5 and 1/2 are the same answer, and x = 13 matches 13. Its own timeout uses signal.alarm, which works
only in a process's main thread; here it is off (parsing_timeout=None, timeout_seconds=None) and the
caller bounds the whole score instead: the reward service and the learner's evaluation both run the
verifier in a child process that is killed after `[reward] verifier_timeout_s` (shared/verifier_pool.py).
SymPy can take forever on a worker's input (\\boxed{9^{9^{9^{9^{9}}}}} does), so that bound is needed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from shared.tasks.base import ChanceBaseline, TaskPrompt
from shared.tasks.chat import user_turn

# Only the tail of a completion is searched: the answer comes last, and this keeps a long ramble from
# costing the verifier (peers cap it alike).
MAX_COMPLETION_CHARS = 2000
BOXED = "\\boxed{"
# A number as a model writes one: optional minus (not one between two operands: "5-3" ends in 3, not -3),
# digits with optional thousands commas, an optional decimal part.
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")

# A candidate answer written in a question, scientific notation included ("1.5e3"): the chance baseline's guesses
CANDIDATE = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
# what may follow a reply's final number: closing punctuation, markup and space, no words
TRAILER = re.compile(r"[\s.,;:!)\]}*$`'\"]*")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every parse that the timeout is off


def last_boxed(text: str) -> str | None:
    """The content of the last complete \\boxed{...} in `text` (nested braces matched), else None."""
    start = text.rfind(BOXED)
    while start != -1:
        depth, begin = 1, start + len(BOXED)
        for index in range(begin, len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    return text[begin:index]
        start = text.rfind(BOXED, 0, start)  # unclosed: an earlier one may be complete
    return None


def last_number(text: str) -> str | None:
    """The last number written in `text`, thousands commas removed ("1,234.5" -> "1234.5"), else None."""
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def math_reward(completion: str, reference: str) -> float:
    """1.0 if the last boxed answer of the completion equals the reference, 0.0 if not or unparsable.
    Unbounded in time on pathological input: call it in a process the caller can kill."""
    return answer_reward(last_boxed(completion[-MAX_COMPLETION_CHARS:]), reference)


def number_reward(completion: str, reference: str) -> float:
    """Like math_reward, but a completion without a \\boxed{...} answers with its last number."""
    tail = completion[-MAX_COMPLETION_CHARS:]
    boxed = last_boxed(tail)
    return answer_reward(boxed if boxed is not None else last_number(tail), reference)


def answer_reward(answer: str | None, reference: str) -> float:
    """1.0 if `answer` (LaTeX without delimiters) equals the reference for math-verify, else 0.0."""
    from math_verify import LatexExtractionConfig, parse, verify

    if answer is None or not answer.strip():
        return 0.0
    boxed_only = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
    predicted = parse(f"\\boxed{{{answer}}}", extraction_config=boxed_only, parsing_timeout=None)
    gold = parse_reference(reference)
    if not predicted or not gold:
        return 0.0
    return 1.0 if verify(gold, predicted, timeout_seconds=None) else 0.0


def parse_reference(reference: str) -> list[object]:
    """The reference as math-verify's gold: LaTeX without delimiters ("\\frac{1}{2}", "-4", "x = 13"),
    or text that already carries them ("$\\frac12$", "\\boxed{3}")."""
    from math_verify import parse

    gold = parse(f"${reference}$", parsing_timeout=None)
    return list(gold) if gold else list(parse(reference, parsing_timeout=None))


def boxed_form(completion: str) -> bool:
    """The completion gives a \\boxed{...} answer (right or wrong): the form `math_reward` reads."""
    answer = last_boxed(completion[-MAX_COMPLETION_CHARS:])
    return answer is not None and bool(answer.strip())


def number_form(completion: str) -> bool:
    """A boxed answer, or the reply ends with a number (punctuation after it at most): the form the
    "number" answer format asks for ("End your reply with the final answer as a number")."""
    tail = completion[-MAX_COMPLETION_CHARS:]
    if boxed_form(tail):
        return True
    matches = list(NUMBER.finditer(tail))
    return bool(matches) and TRAILER.fullmatch(tail[matches[-1].end() :]) is not None


def question_numbers(question: str) -> list[str]:
    """The distinct numbers written in a question, in order: the candidates a format-only guess copies."""
    return list(dict.fromkeys(number.replace(",", "") for number in CANDIDATE.findall(question)))


def copy_a_number_baseline(items: list[TaskPrompt], score: Callable[[str, str], float], wrap: str) -> ChanceBaseline:
    """A guess that copies a number of the question, drawn uniformly from its distinct ones: its expected
    held-out accuracy, each guess scored by the task's own verifier (`wrap`: the guess in the answer form,
    e.g. "\\boxed{{{}}}"). A number_format question ("pick the largest of ...") has the right answer among
    its candidates; a chain_sum one rarely does."""
    expected = 0.0
    for item in items:
        candidates = question_numbers(user_turn(item))
        if candidates:
            hits = sum(1 for candidate in candidates if score(wrap.format(candidate), item.reference) == 1.0)
            expected += hits / len(candidates)
    return ChanceBaseline(expected / len(items) if items else 0.0, "a random number from the question")
