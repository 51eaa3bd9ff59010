"""How the emulator behaves: :class:`EmulatorOptions` (strictness, cadence, limits, auth, faults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from rlkit.backends.sagemaker import names
from rlkit.backends.stand_ins import EngineOptions, FaultOptions, is_number

#: The request-size limit of the strict emulator. The SDK chunks at an *estimated* 10,000,000 bytes
#: ("leaves headroom under the runtime request-size limit"); the service's exact limit is not
#: documented, so the emulator takes the nearest round limit above the SDK's budget.
STRICT_MAX_REQUEST_BYTES = 10 * 1024 * 1024


@dataclass
class EmulatorOptions(EngineOptions, FaultOptions):
    """How the emulator behaves. The local engine's options (``state_dir``, ``precision``,
    ``max_batch_rows``, ``models``: extra hub content name -> local model, ...) and the fault
    options both stand-ins share are :class:`~rlkit.backends.stand_ins.EngineOptions` and
    :class:`~rlkit.backends.stand_ins.FaultOptions`; fault rates are probabilities per runtime
    request.

    ``strict`` (the default) answers as the SDK documents the service and no more generously
    (see ``docs/sagemaker.md``, "Strict and permissive"): forward/forwardBackward metrics are the
    throughput keys plus ``actor/*`` mirrors, per-datum loss outputs are not returned (no request
    field asks for them), a request over ``max_request_bytes`` is refused, the first runtime submit
    after a session turns Running (and the first sampling submit after a saveWeights) meets a
    transient 5xx the SDK retries, a sequence gap not filled within ``gap_timeout_s`` fails the
    session, and an operation sent to a session that is not Running/Blocked is a 409
    ``ConflictException``. ``strict=False`` restores the permissive answers rlkit's tests used
    before (rlkit's own metric names and per-token ``logprobs``).

    ``cadence`` is independent of the answers' shape: ``"sdk"`` (the strict default) answers
    ``Get*OperationResult`` at once and ``CreateTrainingSession`` before the session is Running
    (``Created`` -> ``Scheduled`` -> ``Running``), so the SDK's own 2 s result polls and 10 s
    creation polls run as against the service; ``"fast"`` (the permissive default, and the test
    default) long-polls results up to ``long_poll_s`` and lets ``CreateTrainingSession`` wait up to
    ``create_wait_s`` for Running, so the SDK finds a finished operation on its first poll.
    """

    region: str = "us-west-2"
    account: str = names.EMULATOR_ACCOUNT
    lora_seed: int = 0  # the service seeds LoRA initialisation itself; clients cannot set it
    max_sessions: int = 8  # active sessions per account (ResourceLimitExceeded beyond)
    startup_delay_s: float = 0.0  # extra provisioning time (status Created, then Scheduled, meanwhile)
    strict: bool = True  # answer as the SDK documents the service (see the class docstring)
    cadence: Optional[str] = None  # "sdk" | "fast"; None: "sdk" when strict, else "fast"
    create_wait_s: float = 30.0  # fast cadence: CreateTrainingSession answers once Running or after this long
    long_poll_s: float = 20.0  # fast cadence: Get*OperationResult waits this long for a terminal status
    loss_outputs: Optional[str] = None  # "none" | "actor" | "logprobs"; None: "none" when strict, else "logprobs"
    max_request_bytes: Optional[int] = None  # None: 10 MiB when strict, unlimited otherwise
    warmup_errors: Optional[int] = None  # transient 5xx per warm-up; None: 1 when strict, else 0
    gap_timeout_s: Optional[float] = None  # a Blocked session fails after this; None: 300 s when strict, never otherwise
    auto_create_groups: bool = True  # a session naming an unknown model package group creates it
    require_auth: bool = True  # requests must carry a SigV4 Authorization header
    access_key_id: Optional[str] = None  # when set, the header must name this access key (any other: 403)
    secret_access_key: Optional[str] = None  # when set, the SigV4 signature is verified with it (mismatch: 403)
    allow_remote: bool = False  # bind beyond loopback (needs access_key_id and secret_access_key too)
    ended_session_ttl_s: float = 3600.0  # a Stopped/Failed/Expired session is forgotten this long after it ended
    max_num_samples: int = 128  # numSamples of a sample operation, n of a chat request
    max_chat_tokens: int = 4096  # max_tokens of a chat request (default 256)
    # fault injection beyond FaultOptions' (throttled: ThrottlingException; errors: InternalServerException)
    control_plane_faults: bool = False  # also inject faults into control-plane calls
    session_ttl_s: Optional[float] = None  # inactivity timeout -> Expired
    expire_after_ops: Optional[int] = None  # a session expires when its N+1-th training op is dispatched
    error_ops: Dict[str, int] = field(default_factory=dict)  # operation -> the next N requests answer 5xx
    lost_response_ops: Dict[str, int] = field(default_factory=dict)  # operation -> the next N responses are lost

    FAULT_FIELDS = FaultOptions.FAULT_FIELDS + (
        "control_plane_faults", "session_ttl_s", "expire_after_ops", "error_ops", "lost_response_ops",
        "gap_timeout_s", "long_poll_s", "ended_session_ttl_s")

    @classmethod
    def checked(cls, key: str, value: Any) -> Any:
        """``value`` as the emulator runs with it (``error_ops`` copied, ``None`` as ``{}``), or
        ``ValueError``."""
        if key in ("session_ttl_s", "gap_timeout_s", "long_poll_s", "ended_session_ttl_s"):
            optional = key in ("session_ttl_s", "gap_timeout_s")
            if not (value is None and optional) and (not is_number(value) or not 0 <= value <= 86400 * 1000):
                raise ValueError(f"{key}={value!r} must be a non-negative number" + (" or null" if optional else ""))
        elif key == "control_plane_faults":
            if not isinstance(value, bool):
                raise ValueError(f"{key}={value!r} must be true or false")
        elif key == "expire_after_ops":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{key}={value!r} must be a non-negative integer")
        elif key in ("error_ops", "lost_response_ops"):
            value = value or {}
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in value.items()
            ):
                raise ValueError(f"{key} must map operation names to non-negative integers")
            value = dict(value)
        else:
            value = FaultOptions.checked(key, value)
        return value

    def __post_init__(self) -> None:
        if self.cadence not in (None, "sdk", "fast"):
            raise ValueError(f"cadence={self.cadence!r} must be 'sdk' or 'fast'")
        if self.loss_outputs not in (None, "none", "actor", "logprobs"):
            raise ValueError(f"loss_outputs={self.loss_outputs!r} must be 'none', 'actor' or 'logprobs'")

    # What the ``None`` defaults above resolve to (fields stay as given, so ``replace`` works).
    @property
    def pace(self) -> str:
        return self.cadence or ("sdk" if self.strict else "fast")

    @property
    def outputs(self) -> str:
        return self.loss_outputs or ("none" if self.strict else "logprobs")

    @property
    def request_limit(self) -> Optional[int]:
        return self.max_request_bytes if self.max_request_bytes is not None else (STRICT_MAX_REQUEST_BYTES if self.strict else None)

    @property
    def warmups(self) -> int:
        return self.warmup_errors if self.warmup_errors is not None else (1 if self.strict else 0)

    @property
    def gap_timeout(self) -> Optional[float]:
        return self.gap_timeout_s if self.gap_timeout_s is not None else (300.0 if self.strict else None)

    @property
    def result_wait_s(self) -> float:
        """How long ``Get*OperationResult`` may hold a request (0 on the SDK's cadence)."""
        return self.long_poll_s if self.pace == "fast" else 0.0

    @property
    def create_wait(self) -> float:
        return self.create_wait_s if self.pace == "fast" else 0.0
