"""``rlkit serve tinker`` (also ``rlkit emulate tinker``): the Tinker-compatible server in the foreground.

    rlkit serve tinker --port 8000 [--state-dir DIR] [--model NAME=LOCAL] [--api-key tml-...]
    rlkit serve tinker --nproc 2 --port 8000           # the engine sharded on 2 ranks (FSDP2, torchrun)
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local python my_tinker_script.py

Loopback only unless ``--host`` names another address, which needs ``--api-key`` (or
``$RLKIT_TINKER_API_KEY``); fault injection like ``rlkit emulate sagemaker``'s.

``--nproc N`` (or ``torchrun --nproc-per-node N -m rlkit serve tinker ...``): rank 0 serves HTTP,
the other ranks follow its engine operations in one order (:mod:`rlkit.backends.local.follow`);
a rank that dies ends the server (torch's elastic agent stops the others).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import List

from rlkit.backends.stand_ins import check_fault_flags
from rlkit.errors import ConfigError, listen_error

API_KEY_ENV = "RLKIT_TINKER_API_KEY"
#: ``ServerOptions`` fields set from the flag of the same name (``--max-batch-rows`` -> max_batch_rows)
SAME_NAMED = ("state_dir", "precision", "num_threads", "max_batch_rows", "max_num_samples", "default_max_tokens",
              "lora_alpha", "request_deadline_s", "throttle_rate", "error_rate", "lost_response_rate", "latency_ms",
              "fault_seed")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2, like the rest of the CLI
        raise ConfigError(f"{self.prog}: {message}")


def parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Serve Tinker's API (the tinker SDK, tinker-cookbook) on rlkit's local engine.")
    p.add_argument("--host", default="127.0.0.1", help="loopback by default; another address needs --api-key")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"require this X-API-Key (starts with tml-; repeatable: each key owns what it creates; default ${API_KEY_ENV}, comma-separated)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="checkpoints and their tinker:// index live here (default: a temporary directory)",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=LOCAL",
        help="serve base model NAME as a local model (tiny, smollm2-135m-instruct or a directory); repeatable",
    )
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads of the engine")
    p.add_argument("--max-batch-rows", type=int, default=128, help="most sequences the sampler decodes together")
    p.add_argument(
        "--max-num-samples", type=int, default=64, help="most samples one asample request may ask for (keep it under half of --max-batch-rows)"
    )
    p.add_argument(
        "--request-deadline-s",
        type=float,
        default=900.0,
        help="a sample still running this many seconds after its submit is cancelled, its future failing (0: never)",
    )
    p.add_argument(
        "--default-max-tokens", type=int, default=1024, help="max_tokens of a sample that sets none (capped by the context)"
    )
    p.add_argument("--no-fuse-runs", action="store_true",
                   help="run each client's forward/forward_backward in passes of its own and decode one adapter at a time "
                        "(default: concurrent runs share passes and decode batches)")
    p.add_argument("--lora-alpha", type=int, default=32, help="LoRA alpha of every run (Tinker's API has rank only)")
    p.add_argument(
        "--session-timeout", type=float, default=120.0, help="seconds without a heartbeat before a session is finished"
    )
    p.add_argument("--nproc", type=int, default=None,
                   help="shard the engine over N ranks of this node (torch's elastic agent; default: 1, or torchrun's)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    g = p.add_argument_group("fault injection (API requests)")
    g.add_argument("--throttle-rate", type=float, default=0.0, help="fraction answered 429 before processing")
    g.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 500 before processing")
    g.add_argument("--lost-response-rate", type=float, default=0.0, help="fraction processed, then answered 500")
    g.add_argument("--latency-ms", type=float, default=0.0, help="added to every API request")
    g.add_argument("--fault-seed", type=int, default=0)
    return p


def serve_tinker(argv: List[str], prog: str = "rlkit serve tinker") -> int:
    args = parser(prog).parse_args(argv)
    from rlkit.backends.tinker.server import ServerOptions, TinkerServer

    models = {}
    for item in args.model:
        name, sep, local = item.partition("=")
        if not sep or not name or not local:
            raise ConfigError(f"--model {item!r}: expected NAME=LOCAL (e.g. Qwen/Qwen3-8B=tiny)")
        models[name] = local
    if args.max_num_samples < 1 or args.default_max_tokens < 1:
        raise ConfigError("--max-num-samples and --default-max-tokens must be at least 1")
    if not args.request_deadline_s >= 0:
        raise ConfigError("--request-deadline-s must be 0 (no deadline) or a positive number of seconds")
    keys = args.api_key or [k.strip() for k in os.environ.get(API_KEY_ENV, "").split(",") if k.strip()]
    check_fault_flags(args)  # before --nproc starts ranks
    from rlkit.backends.local import distributed, follow

    ranks = follow.ranks_for(args.nproc, prog)
    if ranks == 0:  # --nproc N: this command again on N ranks under torch's elastic agent
        return distributed.launch(args.nproc, ["serve", "tinker", *follow.relaunch_argv(argv)])
    if ranks > 1 and distributed.init()[0] != 0:  # not rank 0: follow rank 0's engine operations
        follow.quiet_follower()
        return follow.follow()
    options = ServerOptions(
        **{key: getattr(args, key) for key in SAME_NAMED},
        models=models,
        api_key=keys[0] if keys else None,
        api_keys=tuple(keys[1:]),
        fuse_runs=not args.no_fuse_runs,
    )
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        server = TinkerServer(options).bind(args.host, args.port)
    except OSError as exc:  # a port in use: one line, exit 2, like every rlkit server
        raise listen_error(args.host, args.port, exc) from None
    print(f"rlkit Tinker server listening on {server.url}", flush=True)
    print("point the tinker SDK (or tinker-cookbook) at it with:", flush=True)
    for key, value in server.env().items():
        print(f"  export {key}={value}", flush=True)
    print(
        "base models: "
        + ", ".join(sorted({"tiny", "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", *models}))
        + " or a local model directory",
        flush=True,
    )
    return server.serve_until_signalled("server stopped")
