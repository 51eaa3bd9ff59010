"""``rlkit emulate sagemaker`` and ``rlkit sessions``.

    rlkit emulate sagemaker --port 8765 [--state-dir DIR] [--permissive] [--cadence fast] [--throttle-rate 0.1] ...
    rlkit sessions list [--status Running | --active] [--name-contains rlkit] [--json] [--region R | --endpoint URL]
    rlkit sessions stop NAME [NAME ...]          # or --all-active [--name-contains PREFIX]
    rlkit sessions cleanup RUN_DIR [--delete-artifacts] [--dry-run]

``rlkit sessions`` needs only a Region (``--region`` or ``AWS_REGION``) and your usual AWS
credentials; ``--endpoint URL`` (or ``SAGEMAKER_TRAINING_SESSION_ENDPOINT``) reaches an interface
VPC endpoint or the emulator. ``cleanup RUN_DIR`` reads both from the run's ``config.yaml``
(``backend.region``/``backend.endpoint``) unless given. ``list`` is one ``ListTrainingSessions`` call
(paginated; ``--json`` adds a ``DescribeTrainingSession`` per session for its billable tokens) and
``stop`` one ``StopTrainingSession`` per session, so the service calls take well under a second: most
of a command's few seconds is Python start-up (importing the SDK, boto3 and torch). Listing, stopping and cleaning up need no role (``--role-arn`` is
accepted for symmetry with ``backend.role_arn``; only creating a session uses one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import List, Optional

from rlkit.errors import ConfigError, listen_error


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2, like the rest of the CLI
        raise ConfigError(f"{self.prog}: {message}")


def _add_fault_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fault injection (runtime requests)")
    g.add_argument("--throttle-rate", type=float, default=0.0, help="fraction answered ThrottlingException (429)")
    g.add_argument("--error-rate", type=float, default=0.0, help="fraction answered InternalServerException (500) before processing")
    g.add_argument("--lost-response-rate", type=float, default=0.0, help="fraction processed, then answered 500 (the response is lost)")
    g.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    g.add_argument("--control-plane-faults", action="store_true", help="inject faults into control-plane calls too")
    g.add_argument("--fault-seed", type=int, default=0)
    g.add_argument("--session-ttl", type=float, default=None, help="inactivity timeout in seconds (session -> Expired)")
    g.add_argument("--expire-after-ops", type=int, default=None, help="a session expires at its N+1-th training operation")


def emulate_command(argv: List[str]) -> int:
    """``rlkit emulate sagemaker``: serve the emulator in the foreground until Ctrl-C."""
    p = _Parser(prog="rlkit emulate", description="Serve a local emulator of a managed training-session service.")
    p.add_argument("service", choices=["sagemaker", "tinker"], help="the service to emulate (tinker: see rlkit serve tinker --help)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--region", default="us-west-2")
    p.add_argument("--state-dir", default=None, help="checkpoints live here (default: a temporary directory)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads of the engine")
    p.add_argument("--max-batch-rows", type=int, default=128,
                   help="most sequences the sampler decodes together (1: every request alone, so results never depend on arrival timing)")
    p.add_argument("--no-fuse-runs", action="store_true",
                   help="run each session's forward/forward_backward in passes of its own and decode one adapter at a time "
                        "(default: concurrent sessions share passes and decode batches)")
    p.add_argument("--lora-seed", type=int, default=0, help="the seed the 'service' initialises LoRA with")
    p.add_argument("--max-sessions", type=int, default=8, help="active sessions allowed (ResourceLimitExceeded beyond)")
    p.add_argument("--startup-delay", type=float, default=0.0, help="extra seconds a new session stays Created/Scheduled")
    p.add_argument("--permissive", action="store_true",
                   help="answer more than the SDK documents (rlkit's metric names, per-token logprobs; no size limit); default: strict")
    p.add_argument("--cadence", choices=["sdk", "fast"], default=None,
                   help="sdk: results and creation answer at once, so the SDK polls as against the service (strict default); "
                        "fast: long-poll results and let creation wait for Running (permissive default)")
    p.add_argument("--loss-outputs", choices=["none", "actor", "logprobs"], default=None,
                   help="per-datum loss outputs: none (strict default), actor (the documented actor/* form), logprobs (permissive default)")
    p.add_argument("--max-request-bytes", type=int, default=None, help="runtime request-size limit (strict default: 10 MiB)")
    p.add_argument("--gap-timeout", type=float, default=None, help="seconds a session stays Blocked on a sequence gap before it fails (strict default: 300)")
    p.add_argument("--model", action="append", default=[], metavar="HUB_NAME=LOCAL",
                   help="serve another hub content name as a local model name or directory (repeatable)")
    p.add_argument("--no-auth", action="store_true", help="accept requests without a SigV4 Authorization header")
    p.add_argument("--allow-remote", action="store_true",
                   help="listen beyond loopback (--host); needs --access-key-id and --secret-access-key: anyone who reaches the port trains and samples")
    p.add_argument("--access-key-id", default=os.environ.get("RLKIT_EMULATOR_ACCESS_KEY_ID") or None,
                   help="accept only requests signed with this AWS access key id (default $RLKIT_EMULATOR_ACCESS_KEY_ID)")
    p.add_argument("--secret-access-key", default=os.environ.get("RLKIT_EMULATOR_SECRET_ACCESS_KEY") or None,
                   help="verify every request's SigV4 signature with this secret (403 on mismatch or a date over 15 min off); "
                        "prefer $RLKIT_EMULATOR_SECRET_ACCESS_KEY, the default, to keep it out of the process list")
    p.add_argument("--ended-session-ttl", type=float, default=3600.0,
                   help="seconds a Stopped/Failed/Expired session stays listed before it is forgotten")
    p.add_argument("--max-num-samples", type=int, default=128, help="most samples one sample / chat request may ask for")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    _add_fault_options(p)
    args = p.parse_args(argv)

    from rlkit.backends.sagemaker.emulator import Emulator, EmulatorOptions

    models = {}
    for item in args.model:
        if "=" not in item:
            raise ConfigError(f"--model {item!r}: expected HUB_CONTENT_NAME=LOCAL_MODEL")
        k, v = item.split("=", 1)
        models[k] = v
    options = EmulatorOptions(
        region=args.region, state_dir=args.state_dir, precision=args.precision, num_threads=args.num_threads,
        max_batch_rows=args.max_batch_rows, fuse_runs=not args.no_fuse_runs, lora_seed=args.lora_seed, models=models, max_sessions=args.max_sessions, startup_delay_s=args.startup_delay,
        strict=not args.permissive, cadence=args.cadence, loss_outputs=args.loss_outputs,
        max_request_bytes=args.max_request_bytes, gap_timeout_s=args.gap_timeout,
        require_auth=not args.no_auth, access_key_id=args.access_key_id, allow_remote=args.allow_remote,
        secret_access_key=args.secret_access_key, ended_session_ttl_s=args.ended_session_ttl,
        max_num_samples=args.max_num_samples, throttle_rate=args.throttle_rate, error_rate=args.error_rate,
        lost_response_rate=args.lost_response_rate, latency_ms=args.latency_ms, control_plane_faults=args.control_plane_faults,
        fault_seed=args.fault_seed, session_ttl_s=args.session_ttl, expire_after_ops=args.expire_after_ops,
    )
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        emulator = Emulator(options).bind(args.host, args.port)
    except OSError as exc:  # a port in use: one line, exit 2, like every rlkit server
        raise listen_error(args.host, args.port, exc) from None
    from rlkit.backends.sagemaker.names import EMULATOR_MODELS, hub_content_arn

    print(f"rlkit SageMaker emulator listening on {emulator.url}", flush=True)
    mode = "strict" if options.strict else "permissive"
    print(f"answers: {mode} ({options.outputs} loss outputs), cadence: {options.pace}", flush=True)
    print("point the SDK (and rlkit's sagemaker backend) at it with:", flush=True)
    for key, value in emulator.env().items():
        print(f"  export {key}={value}", flush=True)
    print("base models (model.base_model=NAME with backend=sagemaker, or these ARNs with the SDK):", flush=True)
    for local, (name, version) in EMULATOR_MODELS.items():
        print(f"  {local:<22} {hub_content_arn(args.region, name, version)}", flush=True)
    return emulator.serve_until_signalled("emulator stopped")


def _service(args: argparse.Namespace):
    from rlkit.backends.sagemaker.adapter import SageMakerServiceClient

    return SageMakerServiceClient(region=args.region, endpoint=args.endpoint, role_arn=args.role_arn, handle_signals=False, billing_metrics=False)


#: Statuses that hold capacity: what ``--active`` lists and ``--all-active`` stops.
ACTIVE = ("Created", "Scheduled", "Running", "Blocked")


def sessions_command(argv: List[str]) -> int:
    """``rlkit sessions list|stop|cleanup``: find, stop and clean up after training sessions."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--region", default=None, help="default: $AWS_REGION / $AWS_DEFAULT_REGION")
    common.add_argument("--endpoint", default=None,
                        help="an interface VPC endpoint or emulator URL (default: $SAGEMAKER_TRAINING_SESSION_ENDPOINT or the Region's)")
    common.add_argument("--role-arn", default=None, help="not needed to list, stop or clean up (only creating a session uses a role)")
    p = _Parser(prog="rlkit sessions", description="List, stop or clean up after SageMaker training sessions.")
    sub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ls = sub.add_parser("list", help="sessions, newest first", parents=[common])
    ls.add_argument("--status", default=None, help="Created, Scheduled, Running, Blocked, Stopping, Stopped, Failed, Expired, ...")
    ls.add_argument("--active", action="store_true", help="only sessions that hold capacity: " + ", ".join(ACTIVE))
    ls.add_argument("--name-contains", default=None)
    ls.add_argument("--json", action="store_true", help="one JSON object per line, with billable tokens")
    st = sub.add_parser("stop", help="stop sessions by name or ARN", parents=[common])
    st.add_argument("names", nargs="*")
    st.add_argument("--all-active", action="store_true", help="stop every session in " + "/".join(ACTIVE) + " (narrow with --name-contains)")
    st.add_argument("--all-running", action="store_true", help=argparse.SUPPRESS)  # the old name of --all-active
    st.add_argument("--name-contains", default=None)
    cl = sub.add_parser("cleanup", help="delete the model packages a finished run left, except its checkpoints", parents=[common])
    cl.add_argument("run_dir")
    cl.add_argument("--delete-artifacts", action="store_true", help="also delete the packages' S3 artifacts (needs s3:DeleteObject)")
    cl.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    args = p.parse_args(argv)
    if args.action == "stop" and not args.names and not (args.all_active or args.all_running):
        raise ConfigError("rlkit sessions stop: name at least one session, or pass --all-active")
    if args.action == "list" and args.active and args.status:
        raise ConfigError("rlkit sessions list: pass --status or --active, not both")
    if args.action == "cleanup":  # the run recorded where it ran: its Region and endpoint, unless given here
        from pathlib import Path

        from rlkit.backends.sagemaker.cleanup import run_config

        backend = run_config(Path(args.run_dir))
        args.region = args.region or backend.get("region")
        if not args.endpoint and backend.get("endpoint"):
            args.endpoint = backend["endpoint"]
    if not (args.region or args.endpoint or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            or os.environ.get("SAGEMAKER_TRAINING_SESSION_ENDPOINT")):
        raise ConfigError(f"rlkit sessions {args.action}: pass --region (or set AWS_REGION), or --endpoint URL")
    logging.getLogger("sagemaker").setLevel(logging.ERROR)

    service = _service(args)
    try:
        if args.action == "list":
            return _list(service, args)
        if args.action == "cleanup":
            return _cleanup(service, args)
        targets: List[str] = list(args.names)
        if args.all_active or args.all_running:
            targets += [s["training_session_name"] for s in service.list_sessions(name_contains=args.name_contains) if s["status"] in ACTIVE]
        for name in targets:
            service.stop_session(name)
            print(f"stopped {name}")
        if not targets:
            print("no active sessions")
        return 0
    finally:
        service.close()


def _list(service, args: argparse.Namespace) -> int:
    sessions = service.list_sessions(status=args.status, name_contains=args.name_contains)
    if args.active:
        sessions = [s for s in sessions if s["status"] in ACTIVE]
    if args.json:
        for s in sessions:
            row = {**s, "creation_time": str(s["creation_time"])}
            try:
                row["billable_tokens"] = service.billing(s["training_session_name"])
            except Exception:  # noqa: BLE001 - a deleted session cannot be described
                pass
            print(json.dumps(row))
        return 0
    print(f"{'NAME':<44} {'STATUS':<10} CREATED")
    for s in sessions:
        created = s["creation_time"].strftime("%Y-%m-%d %H:%M:%S") if s["creation_time"] else "-"
        print(f"{s['training_session_name']:<44} {s['status']:<10} {created}")
    return 0


def _cleanup(service, args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlkit.backends.sagemaker.cleanup import cleanup_run

    report = cleanup_run(service, Path(args.run_dir), delete_artifacts=args.delete_artifacts, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for arn in report.deleted:
        print(f"{verb} {arn}")
    for arn, step in sorted(report.kept.items(), key=lambda kv: kv[1]):
        print(f"kept {arn} (checkpoint of step {step})")
    if report.gone:
        print(f"{len(report.gone)} more package(s) of the run no longer exist (pruned while it ran); nothing to delete")
    for arn, why in report.failed.items():
        print(f"could not delete {arn}: {why}", file=sys.stderr)
    for name in report.active_sessions:
        print(f"still active: {name}; stop it with rlkit sessions stop NAME once the run has ended", file=sys.stderr)
    print(f"{len(report.deleted)} package(s) {verb}, {len(report.kept)} checkpoint(s) kept"
          + (", artifacts too" if args.delete_artifacts and not args.dry_run else ""))
    return 1 if report.failed else 0


def main(argv: Optional[List[str]] = None) -> int:  # pragma: no cover - python -m convenience
    return sessions_command(list(sys.argv[1:] if argv is None else argv))
