"""The control plane (``sagemaker`` JSON 1.1, ``X-Amz-Target: SageMaker.<Operation>``).

Training sessions (``Create/Describe/List/Stop/DeleteTrainingSession``) and the model-registry
calls the SDK makes (``Create/Describe/List/DeleteModelPackageGroup``,
``Describe/List/DeleteModelPackage``). A model package's ``InferenceSpecification`` names the
base model it was trained on (``Containers[0].BaseModel``) and whether it is a ``saveState``
checkpoint (``IsCheckpoint``), which is what the SDK reads to restore a session from it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from rlkit.backends.sagemaker.emulator.shapes import ServiceError, validation
from rlkit.backends.sagemaker.emulator.state import EmulatorState, Package


def _page(items: List[Any], body: Dict[str, Any], key: str, row: Callable[[Any], Dict[str, Any]],
          default: int = 100) -> Dict[str, Any]:
    """A ``List*`` answer: ``{key: [row(item), ...]}`` for the items from ``NextToken`` on, at most
    ``MaxResults`` (``default``), and the next ``NextToken`` while items are left."""
    start = int(body.get("NextToken") or 0)
    size = int(body.get("MaxResults") or default)
    out: Dict[str, Any] = {key: [row(item) for item in items[start : start + size]]}
    if start + size < len(items):
        out["NextToken"] = str(start + size)
    return out


def _time_filter(created: float, body: Dict[str, Any]) -> bool:
    after, before = body.get("CreationTimeAfter"), body.get("CreationTimeBefore")
    return (after is None or created > float(after)) and (before is None or created < float(before))


class ControlPlane:
    def __init__(self, state: EmulatorState):
        self.state = state
        self.handlers: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
            name: getattr(self, name)
            for name in (
                "CreateTrainingSession", "DescribeTrainingSession", "ListTrainingSessions", "StopTrainingSession",
                "DeleteTrainingSession", "CreateModelPackageGroup", "DescribeModelPackageGroup",
                "ListModelPackageGroups", "DeleteModelPackageGroup", "DescribeModelPackage", "ListModelPackages",
                "DeleteModelPackage",
            )
        }

    def handle(self, operation: str, body: Dict[str, Any]) -> Dict[str, Any]:
        handler = self.handlers.get(operation)
        if handler is None:
            raise ServiceError("UnknownOperationException", f"The emulator does not implement SageMaker.{operation}")
        return handler(body)

    # -- training sessions --------------------------------------------------------------------------
    def CreateTrainingSession(self, body: Dict[str, Any]) -> Dict[str, Any]:
        return {"TrainingSessionArn": self.state.create_session(body).arn}

    def DescribeTrainingSession(self, body: Dict[str, Any]) -> Dict[str, Any]:
        return {"TrainingSessionDetail": self.state.describe(self.state.session(body["TrainingSessionName"]))}

    def ListTrainingSessions(self, body: Dict[str, Any]) -> Dict[str, Any]:
        with self.state.lock:
            sessions = sorted(self.state.sessions.values(), key=lambda s: s.created, reverse=True)
        wanted = [
            s for s in sessions
            if (not body.get("NameContains") or body["NameContains"] in s.name)
            and (not body.get("StatusEquals") or s.status == body["StatusEquals"])
            and _time_filter(s.created, body)
        ]
        return _page(wanted, body, "TrainingSessionSummaries", lambda s: {
            "TrainingSessionArn": s.arn, "TrainingSessionStatus": s.status, "CreationTime": s.created, "LastModifiedTime": s.modified,
        })

    def StopTrainingSession(self, body: Dict[str, Any]) -> Dict[str, Any]:
        self.state.stop_session(body["TrainingSessionName"])
        return {}

    def DeleteTrainingSession(self, body: Dict[str, Any]) -> Dict[str, Any]:
        self.state.delete_session(body["TrainingSessionName"])
        return {}

    # -- model package groups -----------------------------------------------------------------------
    def CreateModelPackageGroup(self, body: Dict[str, Any]) -> Dict[str, Any]:
        name = body["ModelPackageGroupName"]
        with self.state.lock:
            if name in self.state.groups:
                raise validation(f"Model Package Group already exists: {self.state.groups[name]['arn']}")
            group = self.state.ensure_group(name, create=True, description=body.get("ModelPackageGroupDescription") or "")
        return {"ModelPackageGroupArn": group["arn"]}

    def _group(self, name_or_arn: str) -> Dict[str, Any]:
        try:
            return self.state.ensure_group(name_or_arn, create=False)
        except ServiceError:
            raise validation(f"ModelPackageGroup {name_or_arn} does not exist.") from None

    def DescribeModelPackageGroup(self, body: Dict[str, Any]) -> Dict[str, Any]:
        g = self._group(body["ModelPackageGroupName"])
        return {
            "ModelPackageGroupName": g["name"],
            "ModelPackageGroupArn": g["arn"],
            "ModelPackageGroupDescription": g["description"],
            "CreationTime": g["created"],
            "CreatedBy": {},
            "ModelPackageGroupStatus": "Completed",
        }

    def ListModelPackageGroups(self, body: Dict[str, Any]) -> Dict[str, Any]:
        with self.state.lock:
            groups = sorted(self.state.groups.values(), key=lambda g: g["created"], reverse=body.get("SortOrder") != "Ascending")
        groups = [g for g in groups if (not body.get("NameContains") or body["NameContains"] in g["name"]) and _time_filter(g["created"], body)]
        return _page(groups, body, "ModelPackageGroupSummaryList", lambda g: {
            "ModelPackageGroupName": g["name"], "ModelPackageGroupArn": g["arn"], "ModelPackageGroupDescription": g["description"],
            "CreationTime": g["created"], "ModelPackageGroupStatus": "Completed",
        })

    def DeleteModelPackageGroup(self, body: Dict[str, Any]) -> Dict[str, Any]:
        g = self._group(body["ModelPackageGroupName"])
        with self.state.lock:
            if any(p.group == g["name"] for p in self.state.packages.values()):
                raise ServiceError("ConflictException", f"Model package group {g['name']} still holds model packages; delete them first")
            self.state.groups.pop(g["name"], None)
        return {}

    # -- model packages -----------------------------------------------------------------------------
    def _describe_package(self, p: Package) -> Dict[str, Any]:
        return {
            "ModelPackageName": p.group,
            "ModelPackageGroupName": p.group,
            "ModelPackageVersion": p.version,
            "ModelPackageArn": p.arn,
            "ModelPackageDescription": p.description,
            "CreationTime": p.created,
            "LastModifiedTime": p.created,
            "ModelPackageStatus": "Completed",
            "ModelPackageStatusDetails": {"ValidationStatuses": [], "ImageScanStatuses": []},
            "ModelApprovalStatus": "PendingManualApproval",
            "InferenceSpecification": {
                "Containers": [
                    {
                        "Image": "rlkit-emulator",
                        "ModelDataSource": {"S3DataSource": {"S3Uri": p.s3_uri, "S3DataType": "S3Prefix", "CompressionType": "None"}},
                        "IsCheckpoint": p.kind == "checkpoint",
                        "BaseModel": {"HubContentName": p.hub_name, "HubContentVersion": p.hub_version},
                    }
                ],
                "SupportedContentTypes": ["application/json"],
                "SupportedResponseMIMETypes": ["application/json"],
            },
            "CustomerMetadataProperties": {"TrainingSessionName": p.session, "rlkit:LocalCheckpoint": p.local_id},
        }

    def _find_package(self, name: str) -> Package:
        with self.state.lock:
            p = self.state.packages.get(name)
        if p is None:
            raise validation(f"Model package {name} does not exist.")
        return p

    def DescribeModelPackage(self, body: Dict[str, Any]) -> Dict[str, Any]:
        return self._describe_package(self._find_package(body["ModelPackageName"]))

    def ListModelPackages(self, body: Dict[str, Any]) -> Dict[str, Any]:
        group = body.get("ModelPackageGroupName")
        gname = self._group(group)["name"] if group else None
        with self.state.lock:
            packages = [p for p in self.state.packages.values() if gname is None or p.group == gname]
        descending = body.get("SortOrder", "Ascending") == "Descending"
        key = (lambda p: p.arn) if body.get("SortBy") == "Name" else (lambda p: (p.created, p.version))
        packages = sorted((p for p in packages if _time_filter(p.created, body)), key=key, reverse=descending)
        return _page(packages, body, "ModelPackageSummaryList", lambda p: {
            "ModelPackageName": p.group, "ModelPackageGroupName": p.group, "ModelPackageVersion": p.version,
            "ModelPackageArn": p.arn, "ModelPackageDescription": p.description, "CreationTime": p.created,
            "ModelPackageStatus": "Completed", "ModelApprovalStatus": "PendingManualApproval",
        }, default=50)

    def DeleteModelPackage(self, body: Dict[str, Any]) -> Dict[str, Any]:
        p = self._find_package(body["ModelPackageName"])
        with self.state.lock:
            self.state.packages.pop(p.arn, None)
        return {}
