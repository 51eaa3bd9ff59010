"""``rlkit serve`` and ``rlkit endpoint check`` (registered in :mod:`rlkit.cli`).

    rlkit serve --model tiny --port 8000                    the base model
    rlkit serve tinker --port 8000                          Tinker's API (tinker SDK, tinker-cookbook) on the local engine
    rlkit serve --checkpoint local:///path/to/ckpt          a saved checkpoint (its base model from its metadata)
    rlkit serve --follow runs/sft_gsm8k/2025-01-01_12-00    a training run's newest checkpoint, reloaded as it trains
    rlkit serve --sagemaker-session my-session              proxy to a SageMaker session (SigV4; emulator: --endpoint-url)
    RLKIT_API_KEY=secret rlkit serve --model tiny           bearer-token auth (or --api-key)
    rlkit serve --host 0.0.0.0 --api-key KEY               beyond this machine: a key is required
                                                            (--insecure-no-auth serves without one)

    rlkit endpoint check http://127.0.0.1:8000 [--model M] [--api-key K] [--json] [--tokenizer tiny]
    rlkit serve check URL ...                               the same (an alias)

``rlkit endpoint check`` exits 0 when every probe passed (or was skipped), 1 when any failed and
3 when none failed but some passed only in part (:data:`EXIT_PARTIAL`); 2 is a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from rlkit.errors import BackendUnavailableError, ConfigError
from rlkit.backends.http_service import is_loopback  # noqa: F401 (one definition; re-exported for tests)

API_KEY_ENV = "RLKIT_API_KEY"
EXIT_FAILED = 1  # rlkit endpoint check: some probe failed
EXIT_PARTIAL = 3  # rlkit endpoint check: nothing failed, some probe passed only in part

SERVE_EPILOG = """other modes:
  rlkit serve tinker --port 8000     Tinker's API (the tinker SDK, tinker-cookbook) on the local engine
                                     (rlkit serve tinker --help)
  rlkit endpoint check URL           probe which chat-completions parameters an endpoint honours
                                     (also: rlkit serve check URL); exit 0 pass, 1 fail, 3 partial
"""


def _need_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(f"rlkit serve needs the 'serve' extra ({exc.name} is missing): pip install 'rlkit[serve]'") from None


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlkit serve", description="OpenAI-compatible chat completions for an rlkit model, checkpoint or training run.",
                                epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--model", help="a base model: smollm2-135m-instruct (default), tiny, a HF directory")
    what.add_argument("--checkpoint", help="a checkpoint id (local://...) saved by save_state / save_weights_for_sampler")
    what.add_argument("--follow", metavar="RUN_DIR", help="a run directory: serve its newest checkpoint, reloading as the run saves new ones")
    what.add_argument("--sagemaker-session", metavar="NAME", help="proxy to a SageMaker training session's SampleTrainingSession (SigV4, AWS credential chain)")
    p.add_argument("--region", default=None, help="--sagemaker-session: AWS region (default $AWS_REGION)")
    p.add_argument("--endpoint-url", default=None, help="--sagemaker-session: runtime endpoint (default $SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT or AWS's)")
    p.add_argument("--model-package", default=None, help="--sagemaker-session: sample from this model-package ARN (a saved checkpoint)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; unset: no auth, loopback only)")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve a non-loopback --host without an API key (anyone who can reach the port can use it)")
    p.add_argument("--served-model-name", default=None, help="the model id clients pass (default: the model, checkpoint or run name)")
    p.add_argument("--max-tokens", type=int, default=2048, help="largest max_tokens a request may ask for")
    p.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request gives none")
    p.add_argument("--max-n", type=int, default=16, help="largest n")
    p.add_argument("--max-request-bytes", type=int, default=1 << 20, help="largest request body (413 above)")
    p.add_argument("--poll-seconds", type=float, default=2.0, help="--follow: how often to look for a new checkpoint")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: CUDA when available, else the CPU)")
    p.add_argument("--max-batch-rows", type=int, default=128, help="most sequences decoded together")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="uvicorn's line per request on stdout (off by default)")
    return p


def build_source(args: argparse.Namespace, service) -> "object":
    from rlkit.serve.sources import FixedModel, RunFollower

    if getattr(args, "sagemaker_session", None):
        from rlkit.serve.proxy import SageMakerProxy

        return SageMakerProxy(args.sagemaker_session, region=args.region, endpoint_url=args.endpoint_url,
                              model_package_arn=args.model_package, name=args.served_model_name)
    if args.follow:
        return RunFollower(service, args.follow, name=args.served_model_name, poll_seconds=args.poll_seconds)
    if args.checkpoint:
        from pathlib import Path

        from rlkit.backends.local.checkpoints import read_meta, resolve
        from rlkit.errors import CheckpointCorruptError
        from rlkit.serve.sources import servable_problem

        meta = read_meta(args.checkpoint)
        problem = servable_problem(args.checkpoint)
        if problem:
            raise CheckpointCorruptError(f"--checkpoint: {problem}; not serving it", checkpoint=args.checkpoint)
        client = service.create_sampling_client(model_package_arn=args.checkpoint)
        name = args.served_model_name or Path(resolve(args.checkpoint)).name
        return FixedModel(client, name=name, base_model=meta["base_model"], checkpoint=args.checkpoint, step=meta.get("step"), aliases=[args.checkpoint])
    model = args.model or "smollm2-135m-instruct"
    client = service.create_sampling_client(base_model=model)
    return FixedModel(client, name=args.served_model_name or model, base_model=model, aliases=[model])


def resolve_api_key(flag: Optional[str], env: Optional[str]) -> Optional[str]:
    """The key from ``--api-key`` (else ``$RLKIT_API_KEY``); ``None`` when neither is given. An
    empty or blank key is an error, never "auth off"."""
    for value, where in ((flag, "--api-key"), (env, f"${API_KEY_ENV}")):
        if value is None:
            continue
        if not value.strip():
            raise ConfigError(f"{where} is empty: give a real key, or leave it unset to serve without auth on loopback")
        return value.strip()
    return None


def serve_command(argv: List[str]) -> int:
    """``rlkit serve``: run the server in the foreground until Ctrl-C (``rlkit serve tinker``:
    Tinker's API instead of OpenAI's, see :mod:`rlkit.backends.tinker.server.cli`)."""
    if argv[:1] == ["tinker"]:
        from rlkit.backends.tinker.server.cli import serve_tinker

        return serve_tinker(argv[1:])
    if argv[:1] == ["check"]:  # `rlkit serve check URL` = `rlkit endpoint check URL`
        return endpoint_command(argv)
    if argv and not argv[0].startswith("-"):
        from rlkit.imports import suggest

        raise ConfigError(f"rlkit serve: unknown mode {argv[0]!r}; rlkit serve [--model M | --checkpoint ID | --follow RUN_DIR "
                          f"| --sagemaker-session NAME], rlkit serve tinker, or rlkit serve check URL (= rlkit endpoint check)"
                          f"{suggest(argv[0], ['tinker', 'check'])}")
    args = serve_parser().parse_args(argv)
    _need_serve_extra()
    import rlkit
    from rlkit.serve.app import create_app, listen, run_server
    from rlkit.serve.protocol import Limits

    for flag in ("max_tokens", "default_max_tokens", "max_n", "max_request_bytes"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1")
    api_key = resolve_api_key(args.api_key, os.environ.get(API_KEY_ENV))
    exposed = not is_loopback(args.host)
    if exposed and api_key is None and not args.insecure_no_auth:
        raise ConfigError(
            f"--host {args.host!r} is reachable beyond this machine and no API key is set: pass --api-key KEY "
            f"(or set {API_KEY_ENV}), or --insecure-no-auth to serve without authentication"
        )
    sock = listen(args.host, args.port)  # a port in use fails now, before a model is loaded
    limits = Limits(
        max_tokens=args.max_tokens,
        default_max_tokens=min(args.default_max_tokens, args.max_tokens),
        max_n=args.max_n,
        max_request_bytes=args.max_request_bytes,
    )
    service = source = None
    try:
        if not args.sagemaker_session:
            service = rlkit.connect("local", precision=args.precision, max_batch_rows=args.max_batch_rows,
                                    num_threads=args.num_threads, device=args.device)
        source = build_source(args, service)
        app = create_app(source, api_key=api_key, limits=limits)
        snap = source.current()
        if args.sagemaker_session:
            what = f"proxy to SageMaker session {args.sagemaker_session}"
            what += f", {args.model_package}" if args.model_package else ""
        elif args.follow:
            what = f"run {args.follow} (now: {snap.checkpoint or 'base ' + snap.base_model})"
        else:
            what = snap.checkpoint or f"base model {snap.base_model}"
        if api_key:
            auth = "bearer key"
        else:
            auth = "OFF (--insecure-no-auth): anyone who can reach this port can use the model" if exposed else "off"

        def ready(url: str) -> None:
            sys.stderr.write(f"rlkit serve: model '{source.name}' ({what}) at {url}/v1  auth: {auth}\n")
            sys.stderr.flush()

        run_server(app, host=args.host, port=args.port, log_level=args.log_level, ready=ready, sock=sock,
                   access_log=args.access_log)
    finally:
        sock.close()
        if source is not None:
            source.close()
        if service is not None:
            service.close()
    return 0


def endpoint_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlkit endpoint", description="Probe what an OpenAI-compatible chat-completions endpoint really honours.")
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("check", help="run the compatibility probes and print a table (exit 0: all pass; 1: a probe "
                                     "failed; 3: none failed, some partial)")
    c.add_argument("url", help="the base URL an OpenAI client takes (…/v1); a bare http://host:port gets /v1")
    c.add_argument("--model", default=None, help="model id (default: the first one GET /v1/models lists)")
    c.add_argument("--api-key", default=None, help=f"bearer key (default: ${API_KEY_ENV}, then $OPENAI_API_KEY)")
    c.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    c.add_argument("--tokenizer", default=None, help="count prompt tokens with this tokenizer's chat template (rlkit model name or HF id/dir)")
    c.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    c.add_argument("--only", default=None, help="comma-separated probe names")
    return p


def endpoint_command(argv: List[str]) -> int:
    """``rlkit endpoint check URL``."""
    args = endpoint_parser().parse_args(argv)
    from rich.console import Console

    from rlkit.serve.checker import check_endpoint, load_tokenizer, render_table

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or os.environ.get("OPENAI_API_KEY") or None
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    err = Console(stderr=True)
    log = None if args.json else (lambda m: err.print(f"[dim]{m}[/]"))
    only: Optional[List[str]] = args.only.split(",") if args.only else None
    report = check_endpoint(args.url, model=args.model, api_key=api_key, tokenizer=tokenizer, timeout=args.timeout, only=only, log=log)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        Console().print(render_table(report))
        s = report["summary"]
        Console().print(f"{s.get('pass', 0)} pass, {s.get('partial', 0)} partial, {s.get('fail', 0)} fail, {s.get('skip', 0)} skipped")
    return exit_code(report)


def exit_code(report: dict) -> int:
    """0 when every probe passed or was skipped, :data:`EXIT_FAILED` when one failed, else
    :data:`EXIT_PARTIAL` (some passed only in part: a server may still be usable)."""
    found = {r["status"] for r in report["results"]}
    if "fail" in found:
        return EXIT_FAILED
    return EXIT_PARTIAL if "partial" in found else 0
