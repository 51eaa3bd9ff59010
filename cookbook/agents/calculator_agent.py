"""A multi-turn, tool-using agent written only with the ``openai`` package (and the standard
library): it knows nothing of rlkit. rlkit trains it with ``train.task.name=agent
train.task.agent=calculator_agent:solve`` (see README.md).

The agent offers a ``calculator`` tool, asks the model the question, runs every tool call it makes
and sends the results back, for at most ``MAX_TURNS`` model calls; a turn without a call is the
answer. When the model answers without a number it is asked once more ("Reply with the number
only."). The reward is 1 when the first integer of the final answer is the expected one.
``solve`` uses ``openai.OpenAI``; ``solve_async`` is the same agent with ``openai.AsyncOpenAI``
(``train.task.agent=calculator_agent:solve_async``).
"""

from __future__ import annotations

import ast
import json
import operator
import re

import openai

MAX_TURNS = 3
TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression of integers with + - * and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only integers, + - * and parentheses")

    try:
        return str(ev(ast.parse(expression[:200], mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"Error: {exc}"


def _first_messages(problem: dict) -> list:
    return [
        {"role": "system", "content": "You can use the calculator tool. Answer with the number."},
        {"role": "user", "content": problem["question"]},
    ]


def _take_turn(messages: list, message, turn: int):
    """Append the model's turn (and the results of the tools it called) to ``messages``: the final
    answer when the episode is over, else None (another model call follows)."""
    if message.tool_calls:
        messages.append({"role": "assistant", "content": message.content or "",
                         "tool_calls": [c.model_dump() for c in message.tool_calls]})
        for call in message.tool_calls:
            try:
                result = calculator(json.loads(call.function.arguments).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                result = "Error: arguments are not a JSON object"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return None
    answer = message.content or ""
    if re.search(r"-?\d+", answer) or turn == MAX_TURNS - 1:
        return answer
    messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": "Reply with the number only."})
    return None


def _reward(answer, problem: dict) -> float:
    found = re.search(r"-?\d+", (answer or "").replace(",", ""))
    return float(found is not None and int(found.group()) == int(problem["answer"]))


def solve(problem: dict, *, base_url: str, model: str, api_key: str = "rlkit", max_tokens: int = 24) -> float:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    messages, answer = _first_messages(problem), None
    for turn in range(MAX_TURNS):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens)
        answer = _take_turn(messages, response.choices[0].message, turn)
        if answer is not None:
            break
    return _reward(answer, problem)


async def solve_async(problem: dict, *, base_url: str, model: str, api_key: str = "rlkit", max_tokens: int = 24) -> float:
    """The same agent written with ``openai.AsyncOpenAI`` (``train.task.agent=calculator_agent:solve_async``):
    rlkit awaits it, the G episodes of a group as tasks of one event loop."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120) as client:
        messages, answer = _first_messages(problem), None
        for turn in range(MAX_TURNS):
            response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens)
            answer = _take_turn(messages, response.choices[0].message, turn)
            if answer is not None:
                break
    return _reward(answer, problem)
