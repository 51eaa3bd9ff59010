"""Built-in tools: an exact calculator (an AST walk, no ``eval``) and Python in the sandbox.

:class:`Calculator` parses the expression with :func:`ast.parse` (``mode="eval"``) and evaluates
only numbers, ``+ - * / // % **``, unary ``+ -`` and parentheses, over :class:`fractions.Fraction`,
so ``0.1 + 0.2`` is exactly ``0.3`` and ``123456789 * 987654321`` is exact. Names, calls,
attributes, subscripts — anything else — are refused with the node named. Sizes are bounded
before they are computed: at most ``max_chars`` characters and ``max_nodes`` AST nodes; a power's
exponent must be an integer with at most ``max_exponent`` magnitude and the result at most
``max_digits`` digits (estimated from the operands' sizes first, so ``9**9**9`` is refused
instantly instead of running for hours). ``^`` is read as ``**``, ``×``/``÷`` as ``*``/``/``.
Results: an integer; a terminating decimal exactly (``0.375``); otherwise the exact fraction
and a 12-digit decimal (``1/3 ≈ 0.333333333333``).

:class:`PythonTool` runs the model's program with :func:`rlkit.sandbox.run_program` (no network,
no host filesystem, CPU/memory/process/output limits, see :mod:`rlkit.sandbox`) through a bounded
:class:`~rlkit.sandbox.SandboxPool`, and returns its stdout (and stderr on failure, with the
verdict).
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Any, Callable, Dict, Mapping, Optional

from rlkit.tools.base import Tool, ToolError

_BINARY: Dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: operator.mod,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def _digits(x: Fraction) -> int:
    """Decimal digits of the larger of numerator and denominator (0 counts as 1)."""
    return max(len(str(abs(x.numerator))), len(str(x.denominator)))


def format_number(x: Fraction) -> str:
    """An integer, an exact terminating decimal, or ``p/q ≈ decimal``."""
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    twos = fives = 0
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d == 1:  # terminates after max(twos, fives) decimal places
        places = max(twos, fives)
        scaled = abs(x.numerator) * 10**places // x.denominator
        sign = "-" if x < 0 else ""
        whole, frac = divmod(scaled, 10**places)
        return f"{sign}{whole}.{str(frac).rjust(places, '0').rstrip('0')}"
    return f"{x.numerator}/{x.denominator} ≈ {float(x):.12g}"


class Calculator(Tool):
    """Exact arithmetic over an AST (see the module docstring)."""

    name = "calculator"
    description = "Evaluate an arithmetic expression exactly. Supports + - * / // % ** and parentheses."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": 'The expression, e.g. "123 * 456".'}},
        "required": ["expression"],
    }

    def __init__(
        self,
        *,
        max_chars: int = 200,
        max_nodes: int = 100,
        max_exponent: int = 10_000,
        max_digits: int = 1000,
        timeout_s: float = 5.0,
        max_output_chars: int = 2000,
    ):
        self.max_chars, self.max_nodes, self.max_exponent, self.max_digits = (
            max_chars,
            max_nodes,
            max_exponent,
            max_digits,
        )
        self.timeout_s, self.max_output_chars = timeout_s, max_output_chars

    def call(self, arguments: Mapping[str, Any]) -> str:
        return format_number(self.evaluate(str(arguments["expression"])))

    def evaluate(self, expression: str) -> Fraction:
        text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
        if not text:
            raise ToolError("empty expression")
        if len(text) > self.max_chars:
            raise ToolError(f"expression longer than {self.max_chars} characters")
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from None
        nodes = sum(1 for _ in ast.walk(tree))
        if nodes > self.max_nodes:
            raise ToolError(f"expression has {nodes} parts; at most {self.max_nodes}")
        return self._eval(tree.body)

    def _eval(self, node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise ToolError("numbers must be finite")
            return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = self._eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                return self._power(left, right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ToolError("division by zero")
            if isinstance(node.op, ast.Mult) and _digits(left) + _digits(right) > self.max_digits + 1:
                raise ToolError(f"result would exceed {self.max_digits} digits")
            return _BINARY[type(node.op)](left, right)
        raise ToolError(f"unsupported expression element: {type(node).__name__} (only numbers and + - * / // % ** ( ))")

    def _power(self, base: Fraction, exponent: Fraction) -> Fraction:
        if exponent.denominator != 1:
            raise ToolError("exponents must be integers")
        e = exponent.numerator
        if abs(e) > self.max_exponent:
            raise ToolError(f"exponent {e} exceeds {self.max_exponent}")
        if base == 0 and e < 0:
            raise ToolError("division by zero")
        if abs(base) not in (0, 1):  # digits of b**e ~ |e| * log10(b): refuse before computing it
            size = abs(e) * max(math.log10(abs(base.numerator) or 1), math.log10(base.denominator))
            if size > self.max_digits:
                raise ToolError(f"result would exceed {self.max_digits} digits")
        return base**e


class PythonTool(Tool):
    """A Python 3 program, run in :mod:`rlkit.sandbox` (see the module docstring)."""

    name = "python"
    description = "Run a Python 3 program (standard library only, no network, no files) and return what it prints."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The complete program; print the results you need."}},
        "required": ["code"],
    }

    def __init__(
        self,
        *,
        cpu_time_s: float = 2.0,
        wall_time_s: float = 5.0,
        memory_mb: int = 256,
        workers: int = 2,
        max_output_chars: int = 2000,
        pool: Optional[Any] = None,
    ):
        from rlkit.sandbox import SandboxLimits

        self.limits = SandboxLimits(
            cpu_time_s=cpu_time_s,
            wall_time_s=wall_time_s,
            memory_bytes=int(memory_mb) << 20,
            max_output_bytes=max(4 * max_output_chars, 4096),
        )
        self.workers, self._pool, self._own_pool = int(workers), pool, pool is None
        self.timeout_s = wall_time_s + 10.0  # the sandbox's own wall clock fires first; this is a backstop
        self.max_output_chars = max_output_chars

    @property
    def pool(self) -> Any:
        if self._pool is None:
            from rlkit.sandbox import SandboxPool

            self._pool = SandboxPool(self.workers, limits=self.limits)
        return self._pool

    def call(self, arguments: Mapping[str, Any]) -> str:
        result = self.pool.submit(str(arguments["code"])).result()
        if result.verdict == "ok":
            return result.stdout if result.stdout else "(the program printed nothing)"
        if result.verdict == "output_limit":
            raise ToolError(
                f"output limit: the program printed more than {self.limits.max_output_bytes} bytes and was stopped; "
                f"its output, truncated:\n{result.stdout[: self.max_output_chars // 2]}"
            )
        half = self.max_output_chars // 2  # the end of a traceback says what went wrong: keep it
        detail = (result.stderr or result.error or "").strip()[-half:]
        out = result.stdout[:half]
        raise ToolError(
            result.verdict.replace("_", " ") + (f"\n{out}" if out else "") + (f"\n{detail}" if detail else "")
        )

    def close(self) -> None:
        if self._pool is not None and self._own_pool:
            self._pool.close()
            self._pool = None
