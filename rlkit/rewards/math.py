"""Final-answer extraction and grading for math word problems (GSM8K and similar).

:func:`extract_answer` finds the final answer in a completion or a GSM8K reference, trying in
order: the last ``#### X`` line, the last ``\\boxed{X}`` (balanced braces), the last "the answer
is X" / "answer: X" phrase, then the last number in the text. A numeric answer is normalised to a
canonical string: thousands separators, ``$``, ``%``, units and trailing periods are dropped,
``\\frac{a}{b}`` becomes ``a/b`` and decimals lose trailing zeros (``$1,000.50`` -> ``1000.5``).
Anything else (``x^2+1``, ``\\sqrt{2}``) is kept as cleaned LaTeX for math-verify.

:func:`answers_match` decides equality: equal normalised strings, else numeric equality when both
sides are numbers, else ``math_verify.parse`` + ``verify`` under a timeout, else (math-verify
failed or timed out) the numeric fallback on the last number of each side. Two integers are equal
only when identical; otherwise numbers are equal when ``|p - r| <= 1e-6 * max(|p|, |r|)``.

:class:`MathAnswerReward` gives ``r = 1.0`` if the extracted answer matches the reference, else 0.
"""

from __future__ import annotations

import itertools
import logging
import re
import signal
import threading
import time
from fractions import Fraction
from typing import Any, Mapping

from rlkit.errors import DataError, InvalidInputError
from rlkit.rewards.base import RewardResult

REL_TOL = 1e-6
MAX_VERIFY_CHARS = 1000  # longer "answers" skip math-verify and go to the numeric fallback

# One number: 1,000 / 1000.50 / .5 / 12, optionally signed (ASCII or Unicode minus).
_NUM = r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_FRAC = r"[-+]?\\[dt]?frac\s*\{\s*(" + _NUM + r")\s*\}\s*\{\s*(" + _NUM + r")\s*\}"
_PLAIN_NUMBER = _NUM + r"(?:\s*/\s*" + _NUM + r")?"  # 12, -1,000.5, 3/4
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.^])(?:" + _FRAC + r"|(" + _NUM + r")(?:\s*/\s*(" + _NUM + r"))?)(?![\d])"
)
# A whole fragment that is a number: optional "x =" prefix, then the number, then unit words.
_WORD = r"[A-Za-z\u00b0]+(?:\^?[23]|[\u00b2\u00b3])?(?:/[A-Za-z]+)?"  # cm, m^2, km/h
_UNIT = r"(?:\s*" + _WORD + r"(?:\s+" + _WORD + r")*)?"
_NUMERIC_FRAGMENT = re.compile(
    r"^(?:[A-Za-z]\w*\s*=\s*)?(" + _FRAC + r"|" + _PLAIN_NUMBER + r")" + _UNIT + r"$"
)
_HASH_LINE = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_PHRASE = re.compile(
    r"\banswer\s*(?:is\b|:|=)\s*(?:[:=]\s*)?"
    r"([^\n]*?)(?=[.,;!?](?:\s|$)|\n|$)",
    re.IGNORECASE,
)
_EXPRESSION_CHARS = re.compile(r"[\\^_{}()+*=<>]|\w\s*-")
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\s*\{([^{}]*)\}")


def _to_fraction(token: str) -> Fraction | None:
    """``"1,000.50"`` / ``"-3/4"`` / ``"\\frac{3}{4}"`` -> Fraction; else None."""
    token = token.strip()
    m = re.fullmatch(_FRAC, token)
    if m:
        num, den = m.group(1), m.group(2)
    elif re.fullmatch(_PLAIN_NUMBER, token):
        num, _, den = token.partition("/")
    else:
        return None  # e.g. "1,2" (a list, not 12) or "x+1"
    try:
        value = Fraction(num.replace(",", "").replace("\u2212", "-").strip())
        if den:
            value /= Fraction(den.replace(",", "").replace("\u2212", "-").strip())
    except (ValueError, ZeroDivisionError):
        return None
    return -value if (m and token.startswith("-")) else value


def _canonical(value: Fraction, decimal_form: bool) -> str:
    """``1000``, ``1000.5`` (decimal input) or ``3/4`` (fraction input)."""
    if value.denominator == 1:
        return str(value.numerator)
    if decimal_form and abs(value) < 1e15:
        text = format(float(value), "f").rstrip("0").rstrip(".")
        return text if Fraction(text) == value else repr(float(value))
    return f"{value.numerator}/{value.denominator}"


def _clean(fragment: str) -> str | None:
    """Normalise a raw answer fragment; None if nothing is left."""
    s = fragment.strip()
    s = re.sub(r"<<[^>]*>>", "", s)  # GSM8K calculator annotations
    for _ in range(3):
        s = _WRAPPERS.sub(r"\1", s)
    s = s.replace("{,}", ",").replace("\\$", "").replace("$", "").replace("\\%", "")
    s = s.replace("%", "").replace("\\!", "").replace("\\,", "").replace("\\ ", " ")
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s.strip())
    s = re.sub(r"^\*+|\*+$", "", s.strip())  # markdown bold
    s = re.sub(r"\b(?:USD|dollars?)\b", "", s, flags=re.IGNORECASE) if re.search(r"\d", s) else s
    s = s.strip().rstrip(".").strip()
    for _ in range(4):  # redundant outer braces: {{1}} -> 1, but not {1}+{2}
        if _wrapped_in_braces(s):
            s = s[1:-1].strip()
    if not s:
        return None
    m = _NUMERIC_FRAGMENT.match(s)
    if m:
        value = _to_fraction(m.group(1))
        if value is not None:
            return _canonical(value, "." in m.group(1) and "/" not in m.group(1))
    return s


def _boxed_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the contents of every ``\\boxed{...}`` / ``\\fbox{...}`` whose braces
    balance, in order of start. One pass with a stack, so linear even for unbalanced input."""
    starts = {m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)}
    spans, stack = [], []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i + 1)
        elif ch == "}" and stack:
            start = stack.pop()
            if start in starts:
                spans.append((start, i))
    return sorted(spans)


def _wrapped_in_braces(s: str) -> bool:
    """Whether ``s`` is ``{...}`` with the first brace closed by the last character."""
    depth = 0
    for i, ch in enumerate(s if s.startswith("{") else ""):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return i == len(s) - 1
    return False


def _last_number(text: str) -> str | None:
    tokens = list(_NUMBER_TOKEN.finditer(re.sub(r"<<[^>]*>>", "", text)))
    return _clean(tokens[-1].group(0)) if tokens else None


def _is_prose(found: str) -> bool:
    """Words rather than a number or math expression ("she has 12 apples left", "Step 1")."""
    return not _EXPRESSION_CHARS.search(found) and bool(re.search(r"[A-Za-z]{2}", found))


def extract_answer(text: str | None) -> str | None:
    """The final answer in ``text`` as a normalised string, or None when there is none.

    Tried in order (the last occurrence of each wins): ``#### X``; ``\\boxed{X}``;
    "the (final) answer is X" / "answer: X"; the last number anywhere in the text. A ``####``
    line of words (a markdown heading such as ``#### Step 1``) is skipped; words in a box or
    after "answer is" give their last number ("she has 12 apples left" -> ``12``).
    """
    if not text:
        return None
    candidates = itertools.chain(  # lazily, in priority order: (fragment, words allowed)
        ((raw, False) for raw in reversed(_HASH_LINE.findall(text))),
        ((text[a:b], True) for a, b in reversed(_boxed_spans(text))),
        ((m.group(1), True) for m in reversed(list(_ANSWER_PHRASE.finditer(text)))),
    )
    for raw, words_ok in candidates:
        found = _clean(raw)
        if found is None or (not words_ok and _is_prose(found)):
            continue
        return (_last_number(found) or found) if _is_prose(found) else found
    return _last_number(text)


def parse_reference(answer_field: Any) -> str:
    """The normalised final answer of a GSM8K reference (the text after its last ``####``).

    A field without ``####`` is accepted when it is a single short line (a bare answer such as
    ``"1,000"``); anything else raises :class:`DataError` with a one-line message.
    """
    if isinstance(answer_field, (int, float)) and not isinstance(answer_field, bool):
        answer_field = str(answer_field)
    if not isinstance(answer_field, str):
        raise DataError(f"reference answer must be a string, got {type(answer_field).__name__}")
    snippet = repr(answer_field[:60] + ("..." if len(answer_field) > 60 else ""))
    finals = _HASH_LINE.findall(answer_field)
    if finals:
        found = _clean(finals[-1])
        if found is None:
            raise DataError(f"reference answer has an empty '####' line: {snippet}")
        return found
    if "\n" in answer_field.strip() or len(answer_field.strip()) > 40:
        raise DataError(f"reference answer has no '#### <answer>' line: {snippet}")
    found = _clean(answer_field)
    if found is None:
        raise DataError(f"reference answer is empty: {snippet}")
    return found


# ---------------------------------------------------------------------------------- grading


class _Timeout(BaseException):
    """Raised when grading runs past its deadline (a BaseException so no ``except Exception``
    inside math-verify or sympy swallows it)."""


# math-verify warns once when its own timeout is off; ours (below) replaces it, so drop that line.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(lambda rec: "Timeout is disabled" not in rec.getMessage())


def _math_verify(predicted: str, reference: str) -> bool | None:
    """math-verify's verdict, or None when it cannot parse a side. Its own (signal) timeouts are
    off: :func:`_with_timeout` bounds the call from any thread."""
    import math_verify

    gold = math_verify.parse(f"${reference}$", parsing_timeout=None, raise_on_error=True)
    pred = math_verify.parse(f"${predicted}$", parsing_timeout=None, raise_on_error=True)
    if not gold or not pred:
        return None
    return bool(math_verify.verify(gold, pred, timeout_seconds=None, raise_on_error=True))


def _with_timeout(fn, timeout_s: float, *args):
    """``fn(*args)``, raising :class:`_Timeout` after ``timeout_s``.

    In the main thread a SIGALRM interval timer interrupts ``fn`` (a caller's pending alarm is
    restored afterwards). Elsewhere ``fn`` runs in a daemon thread that is abandoned on timeout.
    """
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

        armed = [True]

        def on_alarm(signum, frame):
            if armed[0]:
                raise _Timeout()

        # Pause a caller's pending alarm (atomically), install ours, and arm it inside the try
        # so that no alarm can land where the finally would not restore the caller's state.
        old_delay, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        start = time.monotonic()
        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            return fn(*args)
        finally:
            while armed[0]:  # disarm; an alarm landing mid-way raises here and we retry
                try:
                    armed[0] = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
                except _Timeout:
                    armed[0] = True
            # None: a handler installed from C; the best we can restore is the default.
            signal.signal(signal.SIGALRM, signal.SIG_DFL if old_handler is None else old_handler)
            if old_delay:
                remaining = old_delay - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-3))

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="rlkit-math-verify", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _Timeout()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _numbers_equal(a: Fraction, b: Fraction) -> bool:
    """Exact for two integers (1450001 != 1450000); else within ``REL_TOL`` relative."""
    if a == b or (a.denominator == 1 and b.denominator == 1):
        return a == b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def grade(predicted: str | None, reference: str | None, timeout_s: float = 2.0) -> tuple[bool, str]:
    """``(correct, how)``; ``how`` is one of ``none``, ``exact``, ``numeric``, ``math_verify``,
    ``fallback`` (math-verify failed or timed out; last numbers compared)."""
    if not timeout_s > 0:
        raise InvalidInputError(f"timeout_s must be > 0, got {timeout_s!r}")
    pred = _clean(predicted) if predicted else None
    ref = _clean(reference) if reference else None
    if pred is None or ref is None:
        return False, "none"
    if pred == ref:
        return True, "exact"
    p, r = _to_fraction(pred), _to_fraction(ref)
    if p is not None and r is not None:
        return _numbers_equal(p, r), "numeric"
    try:
        import math_verify  # noqa: F401 - imported (~0.3 s, once) outside the deadline

        if max(len(pred), len(ref)) > MAX_VERIFY_CHARS:
            raise ValueError("answer too long for math-verify")
        verdict = _with_timeout(_math_verify, timeout_s, pred, ref)
    except (Exception, _Timeout):  # any math-verify failure or the deadline -> fallback
        verdict = None
    if verdict is not None:
        return verdict, "math_verify"
    p_last, r_last = _last_number(pred), _last_number(ref)
    p = _to_fraction(p_last) if p_last else None
    r = _to_fraction(r_last) if r_last else None
    return (p is not None and r is not None and _numbers_equal(p, r)), "fallback"


def answers_match(predicted: str | None, reference: str | None, timeout_s: float = 2.0) -> bool:
    """Whether two final answers are equal (see the module docstring for the order of checks).

    Safe to call from any thread; math-verify is bounded by ``timeout_s`` seconds.
    """
    return grade(predicted, reference, timeout_s)[0]


class MathAnswerReward:
    """``r = 1.0`` if the completion's final answer equals the reference, else ``0.0``.

    The reference is ``problem[field]``: a GSM8K answer (``... #### 42``) or a bare answer.
    Metrics: ``correct``, ``has_answer`` (an answer was extracted), ``grader_fallback`` (the
    numeric fallback decided). ``info`` holds ``predicted``, ``reference`` and ``graded_by``.
    """

    name = "math"

    def __init__(self, field: str = "answer", timeout_s: float = 2.0):
        if not timeout_s > 0:
            raise InvalidInputError(f"MathAnswerReward: timeout_s must be > 0, got {timeout_s!r}")
        self.field = field
        self.timeout_s = timeout_s

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        if self.field not in problem:
            raise DataError(f"problem has no {self.field!r} field (keys: {sorted(problem)})")
        reference = parse_reference(problem[self.field])
        predicted = extract_answer(completion)
        correct, how = grade(predicted, reference, self.timeout_s)
        metrics = {
            "correct": float(correct),
            "has_answer": float(predicted is not None),
            "grader_fallback": float(how == "fallback"),
        }
        info = {"predicted": predicted, "reference": reference, "graded_by": how}
        return RewardResult(reward=float(correct), metrics=metrics, info=info)
