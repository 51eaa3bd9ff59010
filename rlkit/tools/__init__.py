"""Tool calling: tools that cannot hurt the host, tool schemas, rendering and strict parsing.

- :mod:`rlkit.tools.base` — :class:`Tool`, :class:`FunctionTool` (any callable), :func:`tool_schema`
  (signature + docstring -> JSON schema), :func:`run_tool` (timeouts, output limits, errors as text);
- :mod:`rlkit.tools.builtin` — :class:`Calculator` (exact, AST, no ``eval``), :class:`PythonTool`
  (a program in :mod:`rlkit.sandbox`);
- :mod:`rlkit.tools.render` — :class:`ToolRenderer` (the template's own tool format, or the ChatML
  fallback), :func:`parse_tool_calls`;
- :mod:`rlkit.tools.stability` — :func:`check_prefix_stability`.

The environment that lets a model act through tools is :class:`rlkit.tasks.tools.ToolTask`.
"""

from rlkit.tools.base import FunctionTool, Tool, ToolError, ToolOutcome, check_arguments, run_tool, tool_schema
from rlkit.tools.builtin import Calculator, PythonTool
from rlkit.tools.render import ParsedTurn, ToolCall, ToolRenderer, parse_tool_calls, template_supports_tools
from rlkit.tools.stability import PrefixReport, check_prefix_stability

__all__ = [
    "Calculator",
    "FunctionTool",
    "ParsedTurn",
    "PrefixReport",
    "PythonTool",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolOutcome",
    "ToolRenderer",
    "check_arguments",
    "check_prefix_stability",
    "parse_tool_calls",
    "run_tool",
    "template_supports_tools",
    "tool_schema",
]
