"""Request validation driven by botocore's own service models, and the services' error shapes.

The emulator does not restate the API: it loads the models botocore ships
(``sagemaker`` 2017-07-24 for the control plane, ``sagemakertrainingsessionruntime`` 2025-02-10
for the runtime) and checks every request against the operation's input shape — required
members, types, enums, numeric ranges (``maxTokens >= 512``, ``learningRate <= 0.01``, ``Rank <=
256``), lengths, name patterns and unions (exactly one member set) — and answers a violation the
way AWS does::

    HTTP 400  {"__type": "ValidationException", "message": "1 validation error detected: Value '16'
              at 'operationConfig.sample.samplingParams.maxTokens' failed to satisfy constraint:
              Member must have value greater than or equal to 512"}

Patterns are matched against the whole value (SageMaker's behaviour: ``my_session`` is not a
valid session name). Patterns that use Java's ``\\p{...}`` classes (tag keys) are not checked.
Unknown members are ignored, as AWS's JSON services do.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Dict, List, Optional

#: Error code -> HTTP status, per plane. Runtime codes and statuses come from the runtime model's
#: error shapes; the control plane (JSON 1.1) answers client errors with 400.
RUNTIME_STATUS = {
    "ValidationException": 400,
    "ConflictException": 409,
    "ThrottlingException": 429,
    "ResourceNotFoundException": 404,
    "InternalServerException": 500,
    "AccessDeniedException": 403,
    "MissingAuthenticationTokenException": 403,
}
CONTROL_STATUS = {
    "ValidationException": 400,
    "ResourceNotFound": 400,
    "ResourceInUse": 400,
    "ResourceLimitExceeded": 400,
    "ConflictException": 400,
    "ThrottlingException": 400,
    "InternalFailure": 500,
    "MissingAuthenticationTokenException": 403,
    "UnknownOperationException": 400,
}

RUNTIME_SERVICE = "sagemakertrainingsessionruntime"
CONTROL_SERVICE = "sagemaker"


class ServiceError(Exception):
    """An error answered in AWS's shape: ``{"__type": code, "message": message}``."""

    def __init__(self, code: str, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def http_status(self, plane: str) -> int:
        if self.status is not None:
            return self.status
        table = RUNTIME_STATUS if plane == "runtime" else CONTROL_STATUS
        return table.get(self.code, 400)


def validation(message: str) -> ServiceError:
    return ServiceError("ValidationException", message)


@functools.lru_cache(maxsize=None)
def service_model(name: str) -> Any:
    """botocore's model of ``name`` (as installed with the SDK)."""
    import botocore.session

    return botocore.session.get_session().get_service_model(name)


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> Optional["re.Pattern[str]"]:
    if "\\p{" in pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None


class Validator:
    """Checks request parameters against one operation's input shape."""

    def __init__(self, service: str):
        self.model = service_model(service)

    def operation(self, name: str) -> Any:
        try:
            return self.model.operation_model(name)
        except Exception:  # noqa: BLE001 - botocore's OperationNotFoundError
            raise ServiceError("UnknownOperationException", f"Unknown operation {name}") from None

    def validate(self, operation: str, params: Dict[str, Any]) -> None:
        """Raise ``ValidationException`` listing every violation (AWS lists up to a few)."""
        shape = self.operation(operation).input_shape
        errors: List[str] = []
        if shape is not None:
            self._check(shape, params, "", errors, top=True)
        if errors:
            shown = errors[:5]
            noun = "error" if len(errors) == 1 else "errors"
            raise validation(f"{len(errors)} validation {noun} detected: " + "; ".join(shown))

    # -- the walk ---------------------------------------------------------------------------------
    def _check(self, shape: Any, value: Any, path: str, errors: List[str], top: bool = False) -> None:
        t = shape.type_name
        where = path or shape.name
        if t == "structure":
            if getattr(shape, "is_document_type", False):
                return
            if not isinstance(value, dict):
                errors.append(f"Value at '{where}' failed to satisfy constraint: Member must be a structure")
                return
            members = shape.members
            for req in shape.required_members:
                if value.get(req) is None:
                    errors.append(f"Value null at '{_join(path, req)}' failed to satisfy constraint: Member must not be null")
            if shape.metadata.get("union"):
                set_members = [k for k in members if value.get(k) is not None]
                if len(set_members) != 1:
                    errors.append(
                        f"Value at '{where}' failed to satisfy constraint: exactly one member must be set "
                        f"(one of {sorted(members)}), got {sorted(set_members) or 'none'}"
                    )
            for name, member in members.items():
                if value.get(name) is not None:
                    self._check(member, value[name], _join(path, name), errors)
        elif t == "list":
            if not isinstance(value, list):
                errors.append(f"Value at '{where}' failed to satisfy constraint: Member must be a list")
                return
            self._length(shape, len(value), value, where, errors)
            for i, item in enumerate(value):
                if item is not None:
                    self._check(shape.member, item, f"{where}.{i + 1}.member", errors)
        elif t == "map":
            if not isinstance(value, dict):
                errors.append(f"Value at '{where}' failed to satisfy constraint: Member must be a map")
                return
            self._length(shape, len(value), value, where, errors)
            for k, v in value.items():
                self._check(shape.key, k, f"{where}.key", errors)
                if v is not None:
                    self._check(shape.value, v, f"{where}.{k}", errors)
        elif t == "string":
            if not isinstance(value, str):
                errors.append(f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: Member must be a string")
                return
            enum = shape.metadata.get("enum")
            if enum and value not in enum:
                errors.append(
                    f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: "
                    f"Member must satisfy enum value set: [{', '.join(enum)}]"
                )
            self._length(shape, len(value), value, where, errors)
            pattern = shape.metadata.get("pattern")
            rx = _compiled(pattern) if pattern else None
            if rx is not None and rx.fullmatch(value) is None:
                errors.append(
                    f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: "
                    f"Member must satisfy regular expression pattern: {pattern}"
                )
        elif t in ("integer", "long"):
            if isinstance(value, bool) or not isinstance(value, int):
                errors.append(f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: Member must be an integer")
                return
            self._range(shape, value, where, errors)
        elif t in ("double", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                errors.append(f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: Member must be a number")
                return
            self._range(shape, value, where, errors)
        elif t == "boolean":
            if not isinstance(value, bool):
                errors.append(f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: Member must be a boolean")
        elif t == "timestamp":
            if not isinstance(value, (int, float, str)) or isinstance(value, bool):
                errors.append(f"Value at '{where}' failed to satisfy constraint: Member must be a timestamp")

    @staticmethod
    def _range(shape: Any, value: float, where: str, errors: List[str]) -> None:
        lo, hi = shape.metadata.get("min"), shape.metadata.get("max")
        if lo is not None and value < lo:
            errors.append(f"Value '{value}' at '{where}' failed to satisfy constraint: Member must have value greater than or equal to {lo}")
        if hi is not None and value > hi:
            errors.append(f"Value '{value}' at '{where}' failed to satisfy constraint: Member must have value less than or equal to {hi}")

    @staticmethod
    def _length(shape: Any, n: int, value: Any, where: str, errors: List[str]) -> None:
        lo, hi = shape.metadata.get("min"), shape.metadata.get("max")
        if lo is not None and n < lo:
            errors.append(f"Value '{_short(value)}' at '{where}' failed to satisfy constraint: Member must have length greater than or equal to {lo}")
        if hi is not None and n > hi:
            errors.append(f"Value at '{where}' failed to satisfy constraint: Member must have length less than or equal to {hi}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."
