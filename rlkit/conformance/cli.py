"""``rlkit conformance ENGINE``: the session contract's test suite against an engine, as a command.

    rlkit conformance local
    rlkit conformance sagemaker --endpoint http://127.0.0.1:8765        # rlkit emulate sagemaker
    rlkit conformance sagemaker --region us-west-2 --role-arn ARN --base-model ARN   # the service
    rlkit conformance tinker --base-url http://127.0.0.1:8000 --api-key tml-...        # any Tinker API
    rlkit conformance vllm [--vllm-url http://127.0.0.1:8000]   # local training, sampling on vLLM (none: one launched)

Prints the engine's declared capability matrix, then each check (pass / refused / wrong / error,
with the measured difference) and exits 0 when nothing is wrong, 1 when something is, 2 for bad
arguments or a URL that is not such a service.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any, Dict, List

from rlkit.errors import ConfigError, RlkitError

ENGINES = ("local", "sagemaker", "tinker", "vllm")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlkit conformance", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", choices=ENGINES, help="which engine's client to check")
    p.add_argument("--base-model", default="tiny", help="the base model to train (default: tiny, rlkit's test model)")
    p.add_argument("--rank", type=int, default=4, help="LoRA rank of the clients the suite creates (default 4)")
    p.add_argument("--base-url", help="tinker: the service's URL (default $TINKER_BASE_URL)")
    p.add_argument("--api-key", help="tinker: an API key (default $TINKER_API_KEY)")
    p.add_argument("--lora-alpha", type=int, default=None, help="tinker: the service's fixed LoRA alpha (default 32)")
    p.add_argument("--endpoint", help="sagemaker: the service endpoint (rlkit emulate sagemaker's URL)")
    p.add_argument("--region", help="sagemaker: the AWS region")
    p.add_argument("--role-arn", help="sagemaker: the IAM role sessions run as")
    p.add_argument("--vllm-url", action="append", default=[], help="vllm: a server serving --base-model (repeatable; none: launch one)")
    p.add_argument("--no-parity", action="store_true", help="skip the same-script comparison with the local engine")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def connect(args: argparse.Namespace, workdir: str) -> Any:
    """The engine's service client, or one line (exit 2) when it cannot be reached."""
    import rlkit

    if args.engine == "local":
        return rlkit.connect("local", precision="fp32", checkpoint_dir=workdir)
    if args.engine == "vllm":  # backend.sampler=vllm: the local trainer, vLLM's sampler (fp32, like the trainer)
        vllm = {"urls": args.vllm_url, "check_model": not args.no_parity} if args.vllm_url else {"launch": True, "dtype": "float32", "log_dir": workdir}
        return rlkit.connect("local", sampler="vllm", vllm=vllm, precision="fp32", checkpoint_dir=workdir)
    if args.engine == "tinker":
        options: Dict[str, Any] = {"base_url": args.base_url, "api_key": args.api_key}
        if args.lora_alpha is not None:
            options["lora_alpha"] = args.lora_alpha
        return rlkit.connect("tinker", **{k: v for k, v in options.items() if v is not None})
    options = {"endpoint": args.endpoint, "runtime_endpoint": args.endpoint, "region": args.region,
               "role_arn": args.role_arn, "checkpoint_dir": workdir}
    return rlkit.connect("sagemaker", **{k: v for k, v in options.items() if v is not None})


def _probe(service: Any, args: argparse.Namespace) -> None:
    """Fail in one line when the service does not answer like one (a wrong URL, not a service)."""
    try:
        service.list_sessions() if args.engine == "sagemaker" else None
    except RlkitError as exc:
        raise ConfigError(f"{args.engine}: {args.endpoint or args.base_url} does not answer as a {args.engine} service ({exc})") from None


def render(capabilities: Any, results: List[Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=None, record=True, width=140)
    matrix = Table(title=f"{capabilities.engine}: declared capabilities", show_lines=False)
    matrix.add_column("capability")
    matrix.add_column("value")
    for name, value in capabilities.rows():
        matrix.add_row(name, value)
    checks = Table(title="contract checks")
    checks.add_column("check")
    checks.add_column("status")
    checks.add_column("measured")
    colour = {"pass": "green", "refused": "yellow", "wrong": "bold red", "error": "bold red"}
    for r in results:
        checks.add_row(r.check, f"[{colour.get(r.status, '')}]{r.status}[/]", r.detail)
    with console.capture() as capture:
        console.print(matrix)
        console.print(checks)
    return capture.get()


def conformance_command(argv: List[str]) -> int:
    from rlkit.conformance.checks import failed, run_suite, summary

    args = parser().parse_args(argv)
    if args.engine == "tinker" and not args.base_url:
        import os

        if not os.environ.get("TINKER_BASE_URL") and not os.environ.get("TINKER_API_KEY"):
            raise ConfigError("conformance tinker: pass --base-url URL (and --api-key) of a Tinker-compatible service")
    say = (lambda m: None) if args.json else (lambda m: print(f"conformance: {m}", file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="rlkit-conformance-") as workdir:
        service = connect(args, workdir)
        reference = None
        try:
            _probe(service, args)
            if args.engine != "local" and not args.no_parity:
                import rlkit

                reference = rlkit.connect("local", precision="fp32", checkpoint_dir=workdir + "/reference")
            results = run_suite(service, base_model=args.base_model, rank=args.rank, reference=reference, progress=say)
            capabilities = service.capabilities
        finally:
            service.close()
            if reference is not None:
                reference.close()
    if args.json:
        print(json.dumps({"engine": args.engine, "capabilities": dict(capabilities.rows()),
                          "results": [vars(r) for r in results], "summary": summary(results)}, indent=2))
    else:
        print(render(capabilities, results))
        counts = summary(results)
        print(", ".join(f"{counts.get(k, 0)} {k}" for k in ("pass", "refused", "wrong", "error")))
    return 1 if failed(results) else 0
