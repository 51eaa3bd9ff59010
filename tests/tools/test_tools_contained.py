"""Tools that cannot hurt the host: the exact calculator refuses everything but arithmetic, the
Python tool runs in the sandbox, user callables get timeouts and output limits, and every
failure comes back as an ``Error: ...`` tool message instead of an exception."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from rlkit.tools import Calculator, FunctionTool, PythonTool, Tool, ToolError, run_tool
from rlkit.tools.builtin import format_number


@pytest.fixture(scope="module")
def calc():
    return Calculator()


@pytest.mark.parametrize(
    "expression,want",
    [
        ("123 * 456", "56088"),
        ("123456789 * 987654321", "121932631112635269"),  # exact beyond float precision
        ("0.1 + 0.2", "0.3"),
        ("(2 + 3) * -4", "-20"),
        ("7 / 8", "0.875"),
        ("-7 // 2", "-4"),
        ("17 % 5", "2"),
        ("2 ^ 10", "1024"),
        ("6 × 7 ÷ 3", "14"),
        ("2 ** -2", "0.25"),
        ("1 / 3", "1/3 ≈ 0.333333333333"),
    ],
)
def test_calculator_is_exact(calc, expression, want):
    assert run_tool(calc, {"expression": expression}).content == want


@pytest.mark.parametrize(
    "expression,error",
    [
        ("__import__('os').system('touch /tmp/pwned')", "unsupported expression element: Call"),
        ("x + 1", "unsupported expression element: Name"),
        ("(1).__class__", "unsupported expression element: Attribute"),
        ("[1, 2][0]", "unsupported expression element: Subscript"),
        ("'a' * 3", "unsupported expression element: Constant"),
        ("9 ** 9 ** 9", "exponent 387420489 exceeds"),
        ("7 ** 5000", "would exceed 1000 digits"),
        ("2 ** 0.5", "exponents must be integers"),
        ("1 / 0", "division by zero"),
        ("1 +", "cannot parse"),
        ("1" * 300, "longer than 200 characters"),
        ("+".join(["1"] * 60), "parts; at most 100"),
    ],
)
def test_calculator_refuses(calc, expression, error):
    started = time.perf_counter()
    out = run_tool(calc, {"expression": expression})
    assert out.error == "tool_error" and out.content.startswith("Error: ") and error in out.content, out.content
    assert time.perf_counter() - started < 2.0  # refused before computing, never evaluated


def test_format_number_by_hand():
    assert format_number(Fraction(-3, 8)) == "-0.375"
    assert format_number(Fraction(1, 40)) == "0.025"
    assert format_number(Fraction(10, 4)) == "2.5"
    assert format_number(Fraction(2, 7)) == "2/7 ≈ 0.285714285714"


def test_bad_arguments_are_a_tool_message(calc):
    out = run_tool(calc, {"expr": "1"})
    assert out.error == "bad_arguments" and "missing required argument 'expression'" in out.content


def test_user_callable_errors_timeouts_and_output_limits():
    def shout(text: str) -> str:
        """Shout.

        Args:
            text: What to shout.
        """
        if text == "boom":
            raise RuntimeError("the tool broke")
        if text == "slow":
            time.sleep(3)
        return text.upper() * 100

    tool = FunctionTool(shout, timeout_s=0.5, max_output_chars=50)
    ok = run_tool(tool, {"text": "ab"})
    assert ok.content.startswith("AB" * 25) and ok.truncated and "[output truncated: 150 more characters]" in ok.content
    assert run_tool(tool, {"text": "boom"}).content == "Error: shout raised RuntimeError: the tool broke"
    started = time.perf_counter()
    slow = run_tool(tool, {"text": "slow"})
    assert slow.error == "timeout" and "timed out after 0.5 s" in slow.content and time.perf_counter() - started < 2.0

    class Refuses(Tool):
        name = "refuses"

        def call(self, arguments):
            raise ToolError("not today")

    assert run_tool(Refuses(), {}).content == "Error: not today"


@pytest.fixture(scope="module")
def python_tool():
    tool = PythonTool(cpu_time_s=1.0, wall_time_s=3.0, max_output_chars=200)
    yield tool
    tool.close()


def test_python_tool_runs_in_the_sandbox(python_tool):
    assert run_tool(python_tool, {"code": "print(sum(range(10)))"}).content == "45\n"
    net = run_tool(python_tool, {"code": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)"})
    assert (
        net.error == "tool_error"
        and "runtime error" in net.content
        and ("Network is unreachable" in net.content or "Errno" in net.content)
    )
    fs = run_tool(python_tool, {"code": "open('/etc/rlkit_pwned', 'w').write('x')"})
    assert fs.error == "tool_error" and ("Read-only file system" in fs.content or "Permission denied" in fs.content)
    loop = run_tool(python_tool, {"code": "while True: pass"})
    assert loop.error == "tool_error" and ("timeout" in loop.content or "killed" in loop.content)
    big = run_tool(python_tool, {"code": "print('x' * 100000)"})
    assert len(big.content) < 400 and "truncated" in big.content
