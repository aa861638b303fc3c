"""What a math scorer must not try: answers whose evaluation would take more digits, nesting or terms than any
machine holds (``9^{9^{9^{9}}}``, ``1000000!``). `intractable` says why in words, or None."""

from __future__ import annotations

import math
import re

MAX_NESTING = 10
"""Brackets nested deeper than this are beyond math-verify's reach: its LaTeX grammar takes exponential time in the
depth (10 braces about 1 s, 15 more than 5 s). The golds of the shipped datasets nest 4 deep at most."""
MAX_DIGITS = 1e6
"""Numbers of more digits than this are beyond its reach: sympy evaluates them (10^{10^6} about 0.5 s, 3^{3^{3^3}}
more than 5 s)."""
FAR_LONGER, MIN_FAR_LONGER = 20, 1000
"""An answer of more than `MIN_FAR_LONGER` characters and more than `FAR_LONGER` times as long as every gold is not
equal to one, at once: math-verify's time grows with the answer (3,000 characters of ``a1 a1 …`` took it 1 s, 21,000
3.5 s, and longer ones its whole 5 s bound), and a policy that has fallen into writing long garbage answers would
hold the scoring workers that long for each."""
_MATH_TOKEN = re.compile(r"\s+|\\(?:(?:left|right|displaystyle)(?![A-Za-z])|[,;:! ])|(\d+(?:\.\d*)?|\.\d+)"
                         r"|(\\[A-Za-z]+|\\.|\*\*|.)", re.S)
_OPENERS, _CLOSERS = {"{", "(", "[", "\\{"}, {"}", ")", "]", "\\}"}
_PRODUCT = {"*", "/", "\\cdot", "\\times", "\\div"}
_BINOMIALS = {"\\binom", "\\dbinom", "\\tbinom"}
_LIMITS = {"\\limits", "\\nolimits"}
BINOMIAL_COST = 10
"""A binomial coefficient counts this many times its digits: sympy computes one far more slowly than a factorial or a
power of as many digits (C(2·10^5, 10^5), 60,000 digits, took math-verify 2.2 s; (2·10^5)!, a million, 0.3 s)."""


def _nesting(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth = max(0, depth - 1)
    return deepest


class _Digits:
    """An upper bound on the decimal digits of every number sympy would compute from a LaTeX expression: each value
    is held as log10 of the larger of |x| and 1/|x|, products and quotients add, sums add log10 2, ``a^b`` multiplies
    a's by b's largest value, ``n!`` is lgamma; letters and symbols count as 1 (sympy keeps ``x^{10^7}`` as it is), a
    command as the product of its braced arguments. Read once, left to right; brackets recurse (`_nesting` bounds
    them first)."""

    def __init__(self, text: str) -> None:
        self.tokens = [(m.group(1), m.group(2)) for m in _MATH_TOKEN.finditer(text) if m.group(1) or m.group(2)]
        self.i, self.most = 0, 0.0

    def peek(self) -> str | None:
        return None if self.i >= len(self.tokens) else self.tokens[self.i][0] or self.tokens[self.i][1]

    def note(self, size: float) -> float:
        self.most = max(self.most, size)
        return size

    def sequence(self, group: bool) -> float:
        """Expressions separated by anything that is not an operator (``,``, ``=``, ``&``…); in a `group`, up to the
        first closing bracket, whichever it is (``(3,4]``; and so, as `_nesting` counts, never deeper than it)."""
        size = 0.0
        while self.peek() is not None and not (group and self.peek() in _CLOSERS):
            start = self.i
            size = max(size, self.sum())
            if self.i == start:  # a separator, or a stray closer
                self.i += 1
        if self.peek() is not None:
            self.i += 1
        return size

    def sum(self) -> float:
        """Terms, or ``n \\choose k`` (each side its terms; chained, in a loop: the answer is hostile)."""
        size = self.terms()
        while self.peek() == "\\choose":
            self.i += 1
            size = self.binomial(size, self.terms())
        return size

    def terms(self) -> float:
        size = self.product()
        while self.peek() in ("+", "-"):
            self.i += 1
            size = self.note(max(size, self.product()) + 0.302)
        return size

    def binomial(self, top: float, bottom: float) -> float:
        """C(n, k) ≤ min(2^n, n^k), at `BINOMIAL_COST` times its digits; no less than n·k, as any command's two
        arguments."""
        digits = min(math.inf if top > 300 else 0.302 * 10 ** top, math.inf if bottom > 300 else top * 10 ** bottom)
        return self.note(max(top + bottom, BINOMIAL_COST * digits))

    def factors(self) -> float:
        """``\\prod_{k=1}^{n}``: as many digits as factors at least (a product of 10^9 of them is sympy's to expand,
        whatever they are); the factor itself follows, and multiplies in as any other."""
        limits = 0.0
        while self.peek() in ("_", "^") or self.peek() in _LIMITS:
            self.i += 1
            if self.tokens[self.i - 1][1] in ("_", "^") and self.peek() != "\\prod":  # \prod_\prod_…: no recursion
                limits = max(limits, self.atom())
        return self.note(math.inf if limits > 300 else 10 ** limits)

    def product(self) -> float:
        size = self.power()
        while self.peek() is not None and (self.peek() in _PRODUCT or self.atom_next()):
            if self.peek() in _PRODUCT:
                self.i += 1
            size = self.note(size + self.power())
        return size

    def atom_next(self) -> bool:
        number, other = self.tokens[self.i]
        return bool(number) or other in _OPENERS or other.isalpha() or (
            other.startswith("\\") and other[1:].isalpha() and other not in _PRODUCT and other != "\\choose")

    def power(self) -> float:
        """``a^b^c``, right to left. ``a^b!`` is read both ways, and the larger kept: ``a^(b!)``, and ``(a^b)!`` as
        math-verify reads it (``10^{6}!`` is a factorial of a million, 5.6 million digits)."""
        while self.peek() in ("+", "-"):  # signs, however many
            self.i += 1
        operands = [self.factorial()]
        bangs = 0
        while self.peek() in ("^", "**"):
            self.i += 1
            while self.peek() in ("+", "-"):
                self.i += 1
            operands[-1], bangs = self.factorial_of(operands[-1], bangs), 0  # an exponent below the top: a^(b!)^c
            operands.append(self.atom())
            bangs = self.bangs()
        exponent = self.factorial_of(operands[-1], bangs)
        return max(self.tower(operands[:-1] + [exponent]), self.factorial_of(self.tower(operands), bangs))

    def tower(self, operands: list[float]) -> float:
        size = operands[-1]
        for base in reversed(operands[:-1]):
            size = self.note(0.0 if base == 0 else math.inf if size > 300 else base * 10 ** size)
        return size

    def bangs(self) -> int:
        count = 0
        while self.peek() == "!":
            self.i += 1
            count += 1
        return count

    def factorial(self) -> float:
        return self.factorial_of(self.atom(), self.bangs())

    def factorial_of(self, size: float, bangs: int) -> float:
        for _ in range(bangs):
            size = self.note(math.inf if size > 15 else math.lgamma(10 ** size + 1) / math.log(10))
        return size

    def atom(self) -> float:
        if self.peek() is None:
            return 0.0
        number, other = self.tokens[self.i]
        self.i += 1
        if number:
            whole = number.split(".")[0].lstrip("0")
            if len(whole) > 15:
                return self.note(float(len(whole)))
            value = float(number)
            return self.note(abs(math.log10(value)) if value else 0.0)
        if other in _OPENERS:
            return self.note(self.sequence(True))
        if other in _BINOMIALS and self.peek() == "{":
            self.i += 1
            top = self.sequence(True)
            bottom = 0.0
            if self.peek() == "{":
                self.i += 1
                bottom = self.sequence(True)
            return self.binomial(top, bottom)
        if other == "\\Gamma" and self.peek() in _OPENERS:  # Γ(x) = (x − 1)!
            return self.factorial_of(self.atom(), 1)
        if other == "\\prod":
            return self.factors()
        if other.startswith("\\") and other[1:].isalpha():  # a command: its braced or bracketed arguments
            size = 0.0
            while self.peek() in ("{", "["):
                self.i += 1
                size += self.sequence(True)
            return self.note(size)
        if other.isalpha():
            return 0.0
        self.i -= 1  # an operator or separator where an operand should be: not consumed here
        return 0.0


def intractable(answer: str, longest: int = 20_000) -> str | None:
    r"""Why math-verify cannot score `answer` in reasonable time, or None: brackets nested deeper than `MAX_NESTING`,
    or numbers of more than `MAX_DIGITS` digits (``9^{9^{9^9}}``, ``(10^6)!``, ``\Gamma(10^{10})``: bounded from above,
    `_Digits`; a binomial counts `BINOMIAL_COST` times its digits, a product of n factors n digits at least).
    Found in a linear pass in the caller's thread (under 0.1 s); an answer longer than `longest` characters is not
    looked at (None: the scoring worker's time bound holds it)."""
    text = str(answer)
    if len(text) > longest:
        return None
    depth = _nesting(text)
    if depth > MAX_NESTING:
        return f"brackets nested {depth} deep"
    digits = _Digits(text)
    digits.sequence(False)
    if digits.most > MAX_DIGITS:
        return "a number of more than 10^6 digits (or a binomial of more than 10^5, or a product of 10^6 factors)"
    return None
