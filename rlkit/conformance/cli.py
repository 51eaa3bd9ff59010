"""``rlkit conformance ENGINE``: the session contract's test suite against an engine, as a command.

    rlkit conformance local
    rlkit conformance local --nproc 2          # the local engine sharded on 2 ranks (torchrun, FSDP2)
    rlkit conformance sagemaker --endpoint http://127.0.0.1:8765        # rlkit emulate sagemaker
    rlkit conformance sagemaker --region us-west-2 --role-arn ARN --base-model ARN   # the service
    rlkit conformance tinker --base-url http://127.0.0.1:8000 --api-key tml-...        # any Tinker API
    rlkit conformance vllm [--vllm-url http://127.0.0.1:8000]   # local training, sampling on vLLM (none: one launched)

Prints the engine's declared capability matrix, then each check (pass / refused / wrong / error,
with the measured difference) and exits 0 when nothing is wrong, 1 when something is, 2 for bad
arguments or a URL that is not such a service.

``--nproc N`` (the local engine only) runs the suite on N ranks of this node: the command starts
torch's elastic agent itself (as ``rlkit train ... backend.nproc=N``), or runs as it is under
``torchrun --nproc-per-node N -m rlkit conformance local``. SPMD: every rank runs the whole suite
against its shard of the engine (the same calls in the same order); rank 0 prints the report,
the other ranks are silent; each rank exits 0 or 1 by its own results, so the agent's exit code is
non-zero when any rank found something wrong.

ENGINE is any registered backend (:data:`rlkit.backends.BACKENDS`) or one of its spec's
``variants`` (``vllm``: the local engine with ``sampler="vllm"``); a third-party engine registered
with :func:`rlkit.register_backend` is checked the same way. Each flag sets the connect option of
its name, and is refused on an engine whose config schema does not declare that option.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Tuple

from rlkit.backends import BACKENDS, BackendSpec
from rlkit.errors import ConfigError, RlkitError

#: flags that set the connect option of the same name
OPTION_FLAGS = ("base_url", "api_key", "lora_alpha", "endpoint", "region", "role_arn")


def engines() -> Dict[str, Tuple[BackendSpec, Mapping[str, Any]]]:
    """ENGINE -> (its backend's spec, the options the name fixes): every registered backend, then
    each spec's variants."""
    out: Dict[str, Tuple[BackendSpec, Mapping[str, Any]]] = {name: (spec, {}) for name, spec in BACKENDS.items()}
    for spec in BACKENDS.values():
        out.update({variant: (spec, fixed) for variant, fixed in spec.variants.items()})
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlkit conformance", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", choices=sorted(engines()), help="which engine's client to check")
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
    p.add_argument("--only", action="append", default=[], metavar="CHECK",
                   help="only the checks whose label starts with CHECK (repeatable: refusals, cross-entropy, built-in, "
                        "defaults, weight decay, save/load, ordering, sampling, temperature, parity)")
    p.add_argument("--nproc", type=int, default=None, help="local: run on N ranks of this node (torchrun; default: 1, or torchrun's)")
    return p


def connect_options(args: argparse.Namespace, workdir: str) -> Tuple[BackendSpec, Dict[str, Any]]:
    """The backend and the options ``rlkit conformance ENGINE`` connects with: the spec's
    ``conformance_options`` and the variant's, each flag given (refused, in one line, where the
    engine's schema does not declare its option), ``checkpoint_dir`` in the suite's scratch
    directory; ``--vllm-url`` names the servers of ``sampler="vllm"`` (none: one is launched)."""
    spec, fixed = engines()[args.engine]
    declared = {f.name for f in dataclasses.fields(spec.schema_class())} if spec.schema is not None else None
    options: Dict[str, Any] = {**spec.conformance_options, **fixed}
    given = {key: getattr(args, key) for key in OPTION_FLAGS if getattr(args, key) is not None}
    if args.vllm_url:
        given["vllm"] = {"urls": args.vllm_url, "check_model": not args.no_parity}
    for key, value in given.items():
        if declared is not None and key not in declared:
            flag = "--vllm-url" if key == "vllm" else "--" + key.replace("_", "-")
            raise ConfigError(f"conformance {args.engine}: {flag} is not an option of backend {spec.name}")
        options[key] = value
    for key, env in spec.conformance_requires.items():
        if key not in options and not any(os.environ.get(e) for e in env):
            raise ConfigError(f"conformance {args.engine}: pass --{key.replace('_', '-')} of a {spec.title} service "
                              f"(or set {' or '.join('$' + e for e in env)})")
    if declared is None or "checkpoint_dir" in declared:
        options["checkpoint_dir"] = workdir
    if isinstance(options.get("vllm"), dict) and options["vllm"].get("launch"):
        options["vllm"] = {**options["vllm"], "log_dir": workdir}
    return spec, options


def connect(args: argparse.Namespace, workdir: str) -> Any:
    """The engine's service client, or one line (exit 2) when it cannot be reached."""
    import rlkit

    spec, options = connect_options(args, workdir)
    return rlkit.connect(spec.name, **options)


def _probe(service: Any, args: argparse.Namespace) -> None:
    """Fail in one line when the service does not answer like one (a wrong URL, not a service)."""
    spec, _ = engines()[args.engine]
    try:
        service.list_sessions()
    except RlkitError as exc:
        where = args.endpoint or args.base_url or "the service"
        raise ConfigError(f"{args.engine}: {where} does not answer as a {spec.title} service ({exc})") from None


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
    from rlkit.backends.local import distributed, follow
    from rlkit.conformance.checks import failed, run_suite, summary

    args = parser().parse_args(argv)
    ranks = follow.ranks_for(args.nproc, f"conformance {args.engine}", local=args.engine == "local")
    if ranks == 0:  # --nproc N outside torchrun: this command again on N ranks under torch's elastic agent
        return distributed.launch(args.nproc, ["conformance", *follow.relaunch_argv(argv)])
    if ranks > 1 and distributed.init()[0] != 0:  # SPMD: every rank runs the suite; rank 0 alone reports
        follow.quiet_follower(follows=False)
        args.json = True  # no progress lines either (its errors still reach stderr)
    say = (lambda m: None) if args.json else (lambda m: print(f"conformance: {m}", file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="rlkit-conformance-") as workdir:
        service = connect(args, workdir)
        reference = None
        try:
            _probe(service, args)
            if args.engine != "local" and not args.no_parity:  # the reference engine
                import rlkit

                reference = rlkit.connect("local", precision="fp32", checkpoint_dir=workdir + "/reference")
            results = run_suite(service, base_model=args.base_model, rank=args.rank, reference=reference, progress=say,
                                only=args.only or None)
            capabilities = service.capabilities
        finally:
            service.close()
            if reference is not None:
                reference.close()
    if args.json:
        print(json.dumps({"engine": args.engine, "ranks": ranks, "capabilities": dict(capabilities.rows()),
                          "results": [vars(r) for r in results], "summary": summary(results)}, indent=2))
    else:
        if ranks > 1:
            print(f"the {args.engine} engine on {ranks} ranks (torchrun, FSDP2; every rank ran every check, rank 0 reports)")
        print(render(capabilities, results))
        counts = summary(results)
        print(", ".join(f"{counts.get(k, 0)} {k}" for k in ("pass", "refused", "wrong", "error")))
    return 1 if failed(results) else 0
