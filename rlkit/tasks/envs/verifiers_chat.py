"""verifiers' own chat harnesses, run in this process (used by :mod:`rlkit.tasks.envs.verifiers_task`).

verifiers 0.4.0 plays a seat with a *harness*: a program that talks to the model through the
rollout's interception endpoint (an OpenAI-compatible URL + secret) and to the task's tools over
MCP. Its two in-house harnesses, ``null`` (the plain chat loop; MCP tools when the task has any)
and ``bash`` (the same loop plus ``bash``/``edit`` tools), are one bundled script
(``verifiers.v1.harnesses.utils.launch.CHAT_PROGRAM_SOURCE``) that verifiers runs in a
``uv``-synced environment — which needs the network. The script's declared dependencies (openai,
mcp, httpx, httpx2, tenacity, certifi) are verifiers' own, so rlkit runs **the same program text
in this process** instead: :class:`InProcessNull` / :class:`InProcessBash` subclass verifiers'
harnesses (flags, prompts, metrics unchanged), skip the ``uv`` install in ``setup`` and run the
program's own ``run_chat_loop`` in ``launch`` with the arguments verifiers would have passed —
the in-process form verifiers' ``Harness.launch`` documents ("a harness may run its loop
in-process ... as long as every model call goes through ``endpoint`` + ``secret``"). The bash
harness's commands and edits run in the rollout's runtime folder, as verifiers' subprocess runtime
runs them.

Importing this module imports verifiers: only :mod:`~rlkit.tasks.envs.verifiers_task` does, once a
verifiers task is built.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import traceback
from pathlib import Path
from typing import Any, Dict, Optional

import httpx
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.bash.harness import (
    BASH_SYSTEM_PROMPT,
    EDIT_SYSTEM_PROMPT,
    BashHarness,
)
from verifiers.v1.harnesses.null.harness import NullHarness
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
from verifiers.v1.runtimes import ProgramResult

#: the bundled chat program (verifiers' mcp + compaction + core modules, as verifiers ships the script)
PROGRAM = compile(CHAT_PROGRAM_SOURCE, "<verifiers chat program>", "exec")
_SHARED: Dict[str, Any] = {}


def program(fresh: bool = False) -> Dict[str, Any]:
    """The chat program's namespace (its ``__main__`` guard off): one shared, or a ``fresh`` one
    whose module-level tools a launch may rebind (the bash harness's working folder)."""
    if fresh or not _SHARED:
        namespace: Dict[str, Any] = {"__name__": "verifiers_chat_program"}
        exec(PROGRAM, namespace)  # noqa: S102 - verifiers' own program text, the script it would run
        if fresh:
            return namespace
        _SHARED.update(namespace)
    return _SHARED


def _run_bash_in(folder: Optional[Path], env: Dict[str, str]):
    def run_bash(command: str) -> str:  # the program's run_bash, in the runtime's folder with the program's environment
        try:
            result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=3600, check=False, cwd=folder,
                                    env=env)
            return result.stdout + result.stderr
        except Exception as e:  # noqa: BLE001 - tool failures are returned to the model, as the program does
            return f"error: {e}"
    return run_bash


def _run_edit_in(folder: Optional[Path], run_edit: Any):
    def edit(path: str, old_str: str, new_str: str) -> str:  # relative paths are the runtime folder's
        if isinstance(path, str) and path and folder is not None and not os.path.isabs(path):
            path = str(folder / path)
        return run_edit(path, old_str, new_str)
    return edit


async def run_chat_program(harness: Any, ctx: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: Dict[str, str],
                           system_prompt: Optional[str], prompt: Any, tool_interception_url: Optional[str], *,
                           bash: bool = False, edit: bool = False, compaction: bool = False,
                           summarize_at_tokens: Optional[int] = None) -> ProgramResult:
    """The chat program's ``main()`` with these arguments, in process: its exit as a ``ProgramResult``
    (0; 97 when the model endpoint is unreachable, as the program exits; 1 with the traceback when it raises)."""
    ns = program(fresh=bash or edit)
    if bash or edit:
        folder = getattr(runtime, "workdir", None)
        # the environment verifiers' subprocess runtime gives the program: the host's (less *API_KEY*), the task's, the harness's
        env = {k: v for k, v in os.environ.items() if "API_KEY" not in k.upper()}
        env.update(runtime.process_env(dict(harness.config.resolved_env)))
        ns["run_bash"] = _run_bash_in(folder, env)
        ns["run_edit"] = _run_edit_in(folder, ns["run_edit"])
    client = ns["AsyncOpenAI"](base_url=endpoint, api_key=secret, timeout=httpx.Timeout(600.0 if bash else None, connect=5.0))
    tool_client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0)) if tool_interception_url else None
    args = argparse.Namespace(tool_interception_url=tool_interception_url or "", api_key=secret, bash=bash, edit=edit,
                              search=False, serper_key="")
    tools = [ns["BASH_TOOL"]] if bash else []
    reserved = {"bash"} if bash else set()
    if edit:
        tools.append(ns["EDIT_TOOL"])
        reserved.add("edit")
    try:
        async with contextlib.AsyncExitStack() as stack:
            if mcp_urls:
                config = {"mcpServers": {name: {"url": url, "timeout": harness.config.tool_timeout} for name, url in mcp_urls.items()}}
                mcp_tools, dispatch, servers = await asyncio.wait_for(ns["connect_mcp"](config, stack, reserved),
                                                                      timeout=None if bash else 60)
            else:
                mcp_tools, dispatch, servers = [], {}, {}
            tools += mcp_tools
            messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            elif prompt:
                messages.extend(message_to_wire(m) for m in prompt)
            compactor = ns["Compactor"](client, ctx.model, tools, compaction, summarize_at_tokens)
            if compactor.enabled and compactor.threshold is None:
                compactor.threshold = await ns["discover_threshold"](client, ctx.model)
            compactor.note_good(messages)
            await ns["run_chat_loop"](args, compactor, messages, dispatch, servers, tool_client)
    except SystemExit as exc:  # the program's own exit on an unreachable model endpoint
        code = exc.code if isinstance(exc.code, int) else 1
        return ProgramResult(exit_code=code, stdout="", stderr=traceback.format_exc())
    except Exception:  # noqa: BLE001 - the program crashed: its exit status and traceback, as a subprocess would give
        return ProgramResult(exit_code=1, stdout="", stderr=traceback.format_exc())
    finally:
        await client.close()
        if tool_client is not None:
            await tool_client.aclose()
    return ProgramResult(exit_code=0, stdout="", stderr="")


class InProcessNull(NullHarness):
    """verifiers' ``null`` harness (the chat loop, MCP tools), its program run in process."""

    async def setup(self, runtime: Any) -> None:
        """Nothing to install: the program's dependencies are verifiers' own."""

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: Dict[str, str],
                     data: Any, tool_interception_url: Optional[str] = None) -> ProgramResult:
        system_prompt, prompt = self.resolve_prompt(data)
        return await run_chat_program(self, ctx, runtime, endpoint, secret, mcp_urls, system_prompt, prompt, tool_interception_url)


class InProcessBash(BashHarness):
    """verifiers' ``bash`` harness (the chat loop with bash/edit tools, compaction), its program run
    in process; commands and edits run in the rollout's runtime folder. ``search`` (a web search
    over the network) is refused."""

    async def setup(self, runtime: Any) -> None:
        """Nothing to install: the program's dependencies are verifiers' own."""

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: Dict[str, str],
                     data: Any, tool_interception_url: Optional[str] = None) -> ProgramResult:
        if self.config.search:
            raise ValueError("the bash harness's search tool needs the network; set its search=false")
        system_prompt, prompt = self.resolve_prompt(data)
        fragments = [BASH_SYSTEM_PROMPT] + ([EDIT_SYSTEM_PROMPT] if self.config.edit else [])
        system_prompt = "\n\n".join(p for p in (" ".join(fragments), system_prompt) if p)
        compaction = self.config.compaction
        return await run_chat_program(self, ctx, runtime, endpoint, secret, mcp_urls, system_prompt, prompt, tool_interception_url,
                                      bash=True, edit=self.config.edit, compaction=compaction is not None,
                                      summarize_at_tokens=compaction.summarize_at_tokens if compaction is not None else None)


def in_process(harness: Any) -> Any:
    """``harness`` as its in-process twin (a null or bash harness), else ``None``."""
    if type(harness) is NullHarness:
        return InProcessNull(harness.config)
    if type(harness) is BashHarness:
        return InProcessBash(harness.config)
    if isinstance(harness, (InProcessNull, InProcessBash)):
        return harness
    return None
