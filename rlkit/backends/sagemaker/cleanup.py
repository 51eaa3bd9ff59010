"""``rlkit sessions cleanup RUN_DIR``: delete the model packages a finished run left on SageMaker.

A run's packages are the ones its ledger (:mod:`.ledger`) records, plus any in the run's model
package groups whose description carries the tag of one of the run's sessions
(``[rlkit lora ... session=NAME]``: a save the process never heard back from, e.g. killed mid-step).
Every checkpoint ``checkpoints.jsonl`` records is kept, so ``rlkit train resume=RUN_DIR`` still
works afterwards; everything else of the run goes (per-step sampler weights, evaluation weights,
packages saved to score trainer logprobs). S3 artifacts are deleted only with
``--delete-artifacts`` (the SDK's ``delete_model_package(delete_artifacts=True)``: needs
``s3:ListBucket`` and ``s3:DeleteObject`` on the output path). Sessions of the run that are still
active are reported, not stopped: run cleanup after the run has ended.

What it reports is what it did: ``deleted`` only for packages that existed (``ListModelPackages`` of
each group the run used) and that the delete removed; the run's packages already gone (the run
prunes each step's sampler weights and its scoring saves as it goes) are counted apart. The
Region and endpoint come from the run's ``config.yaml`` unless ``--region``/``--endpoint`` say
otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from rlkit.backends.sagemaker import ledger, names
from rlkit.errors import ConfigError

#: Session statuses that still hold capacity (everything not on its way out or over).
ACTIVE = ("Created", "Scheduled", "Running", "Blocked")
DEFAULT_GROUP = "sagemaker-default"


@dataclass
class CleanupReport:
    deleted: List[str] = field(default_factory=list)  # deleted now (or, in a dry run, that would be)
    gone: List[str] = field(default_factory=list)  # the run's packages that no longer exist (pruned during the run)
    kept: Dict[str, int] = field(default_factory=dict)  # checkpoint ARN -> step
    failed: Dict[str, str] = field(default_factory=dict)
    active_sessions: List[str] = field(default_factory=list)


def run_config(run_dir: Path) -> Dict[str, Any]:
    """The ``backend`` section of a SageMaker run's ``config.yaml`` (one-line errors otherwise)."""
    return _run_files(Path(run_dir))[0]


def _run_files(run_dir: Path) -> tuple:
    """``(config, ledger records, kept checkpoints {arn: step})`` of a run directory."""
    import yaml

    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"rlkit sessions cleanup: {run_dir} is not an rlkit run directory (no config.yaml)")
    config = yaml.safe_load(config_path.read_text()) or {}
    backend = config.get("backend") or {}
    if backend.get("name") != "sagemaker":
        raise ConfigError(
            f"rlkit sessions cleanup: {run_dir} is a run on backend {backend.get('name')!r}, not sagemaker"
        )
    directory = Path(backend.get("checkpoint_dir") or run_dir / "checkpoints")
    records = ledger.read(directory / ledger.FILENAME)
    kept: Dict[str, int] = {}
    checkpoints = run_dir / "checkpoints.jsonl"
    if checkpoints.is_file():
        for line in checkpoints.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("checkpoint"):
                kept[str(record["checkpoint"])] = int(record.get("step", 0))
    return backend, records, kept


def run_packages(service: Any, backend: Dict[str, Any], records: List[Dict[str, Any]]) -> Tuple[Set[str], Optional[Set[str]], Set[str]]:
    """``(every package ARN the run created: recorded, or tagged with one of its sessions; the
    ARNs that exist now in the groups listed; the groups that could be listed)`` — one
    ``ListModelPackages`` per group."""
    sessions = {r["name"] for r in records if r.get("kind") == "session" and r.get("name")}
    packages = {r["arn"] for r in records if r.get("kind") == "package" and r.get("arn")}
    groups = {names.group_name(backend.get("model_package_group_arn") or DEFAULT_GROUP)}
    groups |= {p["group"] for p in (names.parse_model_package_arn(a) for a in packages) if p}
    existing: Set[str] = set()
    listed: Set[str] = set()
    for group in sorted(groups):
        try:
            infos = service._sdk.list_model_packages(model_package_group_arn=group, max_results=None)
        except Exception:  # noqa: BLE001 - a group that does not exist (any more) holds nothing of the run
            continue
        listed.add(group)
        existing |= {i.model_package_arn for i in infos}
        packages |= {i.model_package_arn for i in infos if names.session_from_description(i.description) in sessions}
    return packages, existing, listed


def _group_of(arn: str) -> Optional[str]:
    parsed = names.parse_model_package_arn(arn)
    return parsed["group"] if parsed else None


def cleanup_run(service: Any, run_dir: Path, *, delete_artifacts: bool = False, dry_run: bool = False) -> CleanupReport:
    """Delete the run's packages except its checkpoints (see the module docstring). Only what
    exists is reported deleted: a package the run already pruned (its per-step sampler weights,
    its scoring saves) is absent from ``ListModelPackages`` and reported as gone; one the service
    says is already absent when deleted (``model_package_deleted=False``) too."""
    backend, records, kept = _run_files(Path(run_dir))
    report = CleanupReport(kept={arn: step for arn, step in kept.items()})
    packages, existing, listed = run_packages(service, backend, records)
    for arn in sorted(packages - set(kept)):
        if _group_of(arn) in listed and arn not in existing:
            report.gone.append(arn)
            continue
        if dry_run:
            report.deleted.append(arn)
            continue
        try:
            result = service._sdk.delete_model_package(arn, delete_artifacts=delete_artifacts)
        except Exception as exc:  # noqa: BLE001 - report it and go on with the others
            report.failed[arn] = " ".join(str(exc).split())
            continue
        (report.deleted if getattr(result, "model_package_deleted", True) else report.gone).append(arn)
    sessions = {r["name"] for r in records if r.get("kind") == "session" and r.get("name")}
    for name in sorted(sessions):
        status, _ = service.session_status(name)
        if status in ACTIVE:
            report.active_sessions.append(f"{name} ({status})")
    return report
