"""Loops are referenced by object and read top to bottom (issue 52 item 6).

Each shipped loop registers itself with ``@loop`` (:mod:`rlkit.loop_registry`): its spec holds the
function and the schema class themselves, so ``rlkit train`` can be followed into a loop by a
reader or an IDE. Every registered loop function, and the serve app's ``create_app``, stays under
80 lines (its pieces are named helpers), and ``import rlkit.loops`` stays cheap: it imports no
loop until one is looked up."""

import ast
import inspect
import subprocess
import sys
import textwrap

from rlkit.loops import LOOPS, get_loop

MAX_LINES = 80
SHIPPED = {"sft", "rl", "dpo", "onpolicy_distill", "offpolicy_distill", "task_sft", "sft_then_rl"}


def lines_of(fn) -> int:
    """The function's lines from ``def`` to its last statement (decorators not counted)."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__
    return node.end_lineno - node.lineno + 1


def test_every_shipped_loop_is_registered_by_object():
    assert SHIPPED <= set(LOOPS)
    for name in SHIPPED:
        spec = get_loop(name)
        assert callable(spec.entry) and not isinstance(spec.entry, str), name
        assert isinstance(spec.schema, type), name
        assert spec.function() is spec.entry and spec.schema_class() is spec.schema
        module = sys.modules[spec.entry.__module__]
        assert getattr(module, spec.entry.__name__) is spec.entry  # reachable by its import path


def test_the_shipped_specs():
    from rlkit.config import SFTConfig
    from rlkit.loops.sft import train_sft
    from rlkit.rl.config import RLConfig, TaskSFTConfig
    from rlkit.rl.loop import train_rl
    from rlkit.rl.pipeline import SFTThenRLConfig, train_sft_then_rl
    from rlkit.rl.task_sft import train_task_sft

    assert (get_loop("sft").entry, get_loop("sft").schema, get_loop("sft").objective, get_loop("sft").direction) == (
        train_sft, SFTConfig, "eval/nll", "minimize")
    assert (get_loop("rl").entry, get_loop("rl").schema, get_loop("rl").direction) == (train_rl, RLConfig, "maximize")
    assert (get_loop("task_sft").entry, get_loop("task_sft").schema) == (train_task_sft, TaskSFTConfig)
    assert (get_loop("sft_then_rl").entry, get_loop("sft_then_rl").schema, get_loop("sft_then_rl").objective) == (
        train_sft_then_rl, SFTThenRLConfig, "rl/eval/greedy_accuracy")


def test_every_loop_function_and_create_app_is_under_80_lines():
    from rlkit.serve.app import create_app

    functions = [spec.function() for spec in LOOPS.values()] + [create_app]
    long = {f"{fn.__module__}.{fn.__name__}": lines_of(fn) for fn in functions if lines_of(fn) >= MAX_LINES}
    assert long == {}


def test_importing_the_registry_imports_no_loop():
    code = ("import sys, rlkit.loops; "
            "print(sorted(m for m in sys.modules if m.startswith(('rlkit.loops.', 'rlkit.rl.', 'rlkit.scaffold'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
