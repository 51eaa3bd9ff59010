"""Typed configuration: the dataclass schemas behind ``configs/`` (Hydra structured configs).

A run's config is composed by Hydra from ``configs/config.yaml`` and its groups::

    config.yaml            defaults: base_config (the :class:`Config` schema below), backend, model,
                           loss, logger, recipe (chosen on the command line), _self_
    backend/local.yaml     typed by LocalBackendConfig  (stored as /schema/backend/local)
    model/*.yaml           typed by ModelConfig         (the ``model`` field of Config)
    loss/*.yaml            a ``_target_`` Loss class and its arguments (instantiated by the loop)
    logger/*.yaml          typed by LoggerConfig
    recipe/*.yaml          ``# @package _global_``: sets ``loop``, ``data``, ``train`` (typed by the
                           loop's schema, e.g. /schema/train/sft) and may override other groups

Because every node is typed, a misspelt key or a wrong type is refused at start-up with its path
(``train.lerning_rate: Key 'lerning_rate' not in 'SFTConfig'``), both in YAML files and in
command-line overrides. :func:`describe_config_error` turns Hydra/OmegaConf errors into one line.

Adding a loop (rl, dpo, distill): write its schema dataclass (subclass :class:`LoopConfig` to get
the optimizer/schedule/checkpoint fields), decorate its function with
``@loop("<name>", schema=<Schema>, objective=...)`` (:mod:`rlkit.loop_registry`; a shipped loop's
module is listed in :func:`rlkit.loops.import_shipped_loops`), and a recipe YAML with ``loop: <name>`` and
``defaults: [/schema/train/<name>@train, _self_]``. :func:`rlkit.loops.register_configs` stores
every loop's schema under ``schema/train/<name>`` (the loop registry owns its schemas; this module
imports nothing from ``rlkit.loops``). Adding a backend: a dataclass with a ``name`` field plus the
options ``rlkit.connect(name, **options)`` takes, named as the ``schema`` of its
:class:`rlkit.backends.BackendSpec` (the one registration, :data:`rlkit.backends.BACKENDS`), and a
``backend/<name>.yaml`` whose defaults start with ``/schema/backend/<name>@_here_``
(``docs/adding-an-engine.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from rlkit.engine.registry import BACKENDS
from rlkit.errors import ConfigError, RlkitError

# -- enums (a wrong value is refused with the allowed list) -------------------------------------------


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    auto = "auto"  # chosen from this machine (rlkit.backends.local.precision)


class LRSchedule(str, Enum):
    constant = "constant"
    linear = "linear"
    cosine = "cosine"


class TrainOn(str, Enum):
    assistant = "assistant"
    last_assistant = "last_assistant"
    all = "all"


class Aggregation(str, Enum):
    """How per-token losses of one step are combined (compiled into the datum weights by
    :mod:`rlkit.losses.aggregation`)."""

    sum = "sum"  # sum over tokens: the step's gradient scales with its token count
    token_mean = "token_mean"  # divided by the step's number of trained tokens
    seq_mean = "seq_mean"  # each sequence's token mean, averaged over sequences
    constant = "constant"  # divided by a constant (Dr. GRPO)


class Direction(str, Enum):
    minimize = "minimize"
    maximize = "maximize"


class WandbMode(str, Enum):
    online = "online"
    offline = "offline"
    disabled = "disabled"


# -- groups --------------------------------------------------------------------------------------------


@dataclass
class VllmConfig:
    """``backend.vllm``: the vLLM servers of ``backend.sampler=vllm`` (rlkit.backends.vllm.options.VllmOptions:
    same fields and defaults; docs/scale.md)."""

    urls: List[str] = field(default_factory=list)  # servers you run (http://host:port)
    launch: Optional[bool] = None  # start a vLLM server here (from .venv-vllm: bash scripts/install.sh vllm); null = when urls is empty
    python: Optional[str] = None  # the Python of vLLM's environment; null = ./.venv-vllm/bin/python (scripts/install.sh vllm)
    port: Optional[int] = None  # the launched server's port; null = a free one
    model: Optional[str] = None  # what a launched server serves; null = the trainer's base model
    served_model_name: Optional[str] = None  # null = launched: the base model's name; urls: asked (/v1/models)
    adapter_dir: Optional[str] = None  # weight versions (PEFT adapters); null = <checkpoint_dir>/vllm-adapters; remote servers: a shared filesystem
    adapter_dir_on_server: Optional[str] = None  # adapter_dir as the servers mount it; null = the same path
    log_dir: Optional[str] = None  # the launched server's log; null = the run directory
    max_lora_rank: int = 64
    max_loras: int = 2
    max_model_len: Optional[int] = None
    dtype: str = "auto"
    per_request_seed: bool = False  # the CPU build crashes on a per-request seed; true for GPU servers
    check_model: bool = True  # refuse servers whose base model is not the trainer's (a logprob probe); false: off-policy on purpose
    max_concurrent_requests: int = 64
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 900.0
    extra_args: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)


@dataclass
class LocalBackendConfig:
    """``rlkit.connect("local", ...)``. ``checkpoint_dir: null`` means ``<run_dir>/checkpoints``;
    ``precision: auto`` picks fp32 or bf16 from this machine (see :mod:`rlkit.backends.local.precision`)."""

    name: str = "local"
    precision: Precision = Precision.auto
    checkpoint_dir: Optional[str] = None
    micro_batch_tokens: int = 2048
    max_batch_rows: int = 128
    num_threads: Optional[int] = None
    device: Optional[str] = None  # cpu | cuda | cuda:N | mps; null = CUDA when available, else the CPU
    activation_checkpointing: str = "auto"  # auto | true | false (rlkit.backends.local.activations)
    memory_limit_gb: Optional[float] = None  # with auto: a training step keeps the process under this many GiB; null = free memory decides
    sampler: str = "local"  # local | vllm (training here, sampling on vLLM servers: backend.vllm)
    nproc: int = 1  # ranks on this node: >1 makes `rlkit train` start torch's elastic agent (rlkit.backends.local.distributed)
    rank_timeout_s: Optional[float] = None  # on N ranks: a rank waiting longer for the others in one collective ends the run; null = 1800 (distributed.RANK_TIMEOUT_S)
    dist_backend: str = "auto"  # on N ranks: auto (gloo; NCCL for CUDA tensors where CUDA is present) | gloo | nccl
    vllm: VllmConfig = field(default_factory=VllmConfig)


@dataclass
class SageMakerBackendConfig:
    """``rlkit.connect("sagemaker", ...)``: SageMaker AI training sessions through the
    ``sagemaker-train`` SDK (see ``docs/sagemaker.md``). ``endpoint`` points at an emulator
    (``rlkit emulate sagemaker``); ``precision``/``num_threads`` exist so recipes written for
    ``local`` compose (the service picks its precision; threads are the client's)."""

    name: str = "sagemaker"
    region: Optional[str] = None  # null = $AWS_REGION / $AWS_DEFAULT_REGION
    role_arn: Optional[str] = None  # required on SageMaker
    model_package_group_arn: Optional[str] = None  # null = the account's sagemaker-default group
    s3_output_path: Optional[str] = None
    kms_key_arn: Optional[str] = None
    vpc_config: Optional[Dict[str, Any]] = None  # {subnets: [...], security_group_ids: [...]}
    endpoint: Optional[str] = None  # null = the Region's endpoint (or $SAGEMAKER_TRAINING_SESSION_ENDPOINT)
    runtime_endpoint: Optional[str] = None  # null = endpoint
    session_name_prefix: str = "rlkit"
    base_models: Dict[str, str] = field(default_factory=dict)  # alias -> model id or hub-content ARN
    tokenizer: Optional[str] = None  # a local path or HF id, for base models rlkit cannot resolve
    min_max_tokens: int = 512  # the service's floor on max_tokens (shorter requests are cut client-side)
    billing_metrics: bool = True  # log the session's BillableTokenUsage (read once per step, in the background)
    emulator: Optional[bool] = None  # null = ask the endpoint (the emulator answers a handshake); true/false = say so
    trainer_logprobs: str = "auto"  # auto | service | scoring: where forward/forward_backward logprobs come from
    always_score_logprobs: bool = False  # true: score trainer logprobs after every forward_backward (the old behaviour)
    operation_timeout_s: Optional[float] = 3600.0  # longest wait for one operation's result (null = forever)
    keep_published_weights: bool = False  # false: delete sampler-weight packages once superseded and unused
    delete_artifacts: bool = False  # also delete the S3 artifacts of packages rlkit deletes
    checkpoint_dir: Optional[str] = None  # null = <run_dir>/checkpoints: the record of sessions/packages a run created
    precision: Optional[Precision] = None  # not sent: the service chooses its precision
    num_threads: Optional[int] = None  # client-side torch threads (linearised losses)


@dataclass
class TinkerBackendConfig:
    """``rlkit.connect("tinker", ...)``: Thinking Machines' Tinker through the ``tinker`` SDK, or
    ``rlkit serve tinker`` (``base_url``); see ``docs/tinker.md``. ``precision`` exists so recipes
    written for ``local`` compose (the service picks its precision)."""

    name: str = "tinker"
    api_key: Optional[str] = None  # null = $TINKER_API_KEY
    base_url: Optional[str] = None  # null = $TINKER_BASE_URL, else Thinking Machines' service
    base_models: Dict[str, str] = field(default_factory=dict)  # alias -> Tinker model name
    tokenizer: Optional[str] = None  # a local path or HF id, instead of the SDK's tokenizer lookup
    precision: Optional[Precision] = None  # not sent: the service chooses its precision
    num_threads: Optional[int] = None  # client-side torch threads (linearised losses)
    lora_alpha: int = 32  # the service's fixed LoRA alpha (Tinker has rank only); model.alpha must equal it


def backend_schemas() -> Dict[str, Any]:
    """Backend name -> schema dataclass, read from each registered :class:`rlkit.backends.BackendSpec`
    (a ``backend/<name>.yaml`` references ``/schema/backend/<name>``)."""
    return {name: spec.schema_class() for name, spec in BACKENDS.items() if spec.schema is not None}


@dataclass
class ModelConfig:
    """The base model and its LoRA adapter (``create_lora_training_client`` arguments)."""

    base_model: str = MISSING
    rank: int = 32
    alpha: int = 32  # rlkit.engine.DEFAULT_LORA_ALPHA: the one default every engine honours
    train_attn: bool = True
    train_mlp: bool = True
    seed: Optional[int] = None  # LoRA initialisation seed; null = the run's ``seed``
    lora: bool = True  # false: full-parameter fine-tuning, every weight trains (rank/alpha/train_* unused; backend=local only)


@dataclass
class LoggerConfig:
    """Where metrics go besides ``metrics.jsonl`` (always written)."""

    console: bool = True  # a live progress bar on a terminal, a line every ``log_every`` steps otherwise
    log_every: int = 1
    wandb: bool = False
    project: str = "rlkit"
    entity: Optional[str] = None
    mode: Optional[WandbMode] = None  # null = $WANDB_MODE, else online
    name: Optional[str] = None  # null = the run directory's name
    group: Optional[str] = None  # null = one group per sweep (its directory), none for a single run
    tags: List[str] = field(default_factory=list)


@dataclass
class SweepConfig:
    """What ``rlkit train -m`` optimises and reports (:mod:`rlkit.sweep.objective`): each job returns
    its objective to Hydra's sweeper (Optuna, Nevergrad, Ax minimise or maximise it)."""

    objective: Optional[str] = None  # a metric key; null = the loop's main held-out metric
    direction: Optional[Direction] = None  # null = the loop's (its own objective) or by the key's name
    failed_value: Optional[float] = None  # told for a failed/diverged job; null = the worst (+-inf)


@dataclass
class DatasetConfig:
    """One dataset: a Hugging Face dataset id (tried first when set) and/or a local file.

    ``path`` is a JSONL/JSON/parquet file: absolute, relative to the working directory, or relative
    to a data root (``$RLKIT_DATA``, or a ``shared/data`` folder above the working directory or the
    package). With ``hf_id`` set, ``path`` is the offline fallback.
    """

    path: Optional[str] = None
    hf_id: Optional[str] = None
    hf_config: Optional[str] = None
    split: str = "train"
    start: int = 0  # skip this many records
    limit: Optional[int] = None  # then keep at most this many


@dataclass
class DataConfig:
    train: DatasetConfig = field(default_factory=DatasetConfig)
    eval: Optional[DatasetConfig] = None


# -- loops ---------------------------------------------------------------------------------------------


@dataclass
class LoopConfig:
    """Fields every loop shares: length, optimizer, learning-rate schedule, evaluation, checkpoints."""

    steps: Optional[int] = None  # optimizer steps; null = derived from ``epochs`` where the loop can
    learning_rate: float = 1e-4
    lr_schedule: LRSchedule = LRSchedule.cosine
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # the schedule decays to learning_rate * min_lr_ratio
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: Optional[float] = 1.0
    eval_every: int = 0  # 0 = evaluate before the first and after the last step only
    checkpoint_every: int = 0  # 0 = checkpoint after the last step only
    # start from these weights (a checkpoint id: local://..., a model-package ARN) with a fresh
    # optimizer, e.g. RL from an SFT run's last checkpoint; ignored when the run resumes
    init_checkpoint: Optional[str] = None

    def scoring_temperature(self) -> float:
        """The temperature this loop asks the trainer to score sampled tokens at: 1.0 unless the loop
        samples at another and scores with it. An engine whose trainer scores at temperature 1 only
        (``Capabilities.scores_any_temperature`` false) refuses a run where this is not 1
        (:func:`rlkit.composition.check_scoring_temperature`). Declared here, so a new loop is checked too."""
        return 1.0

    def temperature_fix(self, engine: str) -> str:
        """What the refusal of such an engine suggests instead."""
        return f"run this loop at temperature 1.0 on {engine}"

    def learning_rate_at(self, step: int, total: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based) out of ``total``: linear warmup from
        ``learning_rate / warmup_steps`` to ``learning_rate``, then constant / linear / cosine decay
        to ``learning_rate * min_lr_ratio`` at the last step."""
        peak = self.learning_rate
        if self.warmup_steps and step < self.warmup_steps:
            return peak * (step + 1) / self.warmup_steps
        schedule = LRSchedule(self.lr_schedule)
        if schedule is LRSchedule.constant:
            return peak
        span = max(total - self.warmup_steps - 1, 1)
        progress = min(max(step - self.warmup_steps, 0) / span, 1.0)
        floor = peak * self.min_lr_ratio
        if schedule is LRSchedule.linear:
            return floor + (peak - floor) * (1.0 - progress)
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def adam_params(self, learning_rate: float):
        from rlkit.types import AdamParams

        return AdamParams(
            learning_rate=learning_rate,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )

    def check(self) -> None:
        """Refuse values no run can use (before anything starts), naming the key: raises
        :class:`ConfigError`. Subclasses extend it with their own fields (call ``super().check()``)."""
        require(self.steps is None or self.steps >= 1, "train.steps", self.steps, "must be a positive integer (or null)")
        require(self.learning_rate > 0, "train.learning_rate", self.learning_rate, "must be > 0")
        require(self.warmup_steps >= 0, "train.warmup_steps", self.warmup_steps, "must be >= 0")
        require(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        for key in ("beta1", "beta2"):
            require(0.0 <= getattr(self, key) < 1.0, f"train.{key}", getattr(self, key), "must be in [0, 1)")
        require(self.eps > 0, "train.eps", self.eps, "must be > 0")
        require(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "must be >= 0")
        require(self.grad_clip_norm is None or self.grad_clip_norm > 0, "train.grad_clip_norm", self.grad_clip_norm, "must be > 0 (or null)")
        require(self.eval_every >= 0, "train.eval_every", self.eval_every, "must be >= 0 (0 = first and last step only)")
        require(self.checkpoint_every >= 0, "train.checkpoint_every", self.checkpoint_every, "must be >= 0 (0 = last step only)")

    @staticmethod
    def due(every: int, done: int, total: int) -> bool:
        """Whether a periodic action (every ``every`` steps; 0 = never in between) is due after
        ``done`` completed steps. The end of the run (``done == total``) is always due."""
        return done == total or (every > 0 and done % every == 0)


@dataclass
class ChatFormatConfig:
    """How a record becomes a conversation (see :func:`rlkit.data.conversation_builder`)."""

    messages_field: Optional[str] = None  # records already hold chat messages in this field
    prompt_field: str = "prompt"  # else: user turn = this field ...
    completion_field: str = "completion"  # ... assistant turn = this field
    system_prompt: Optional[str] = None
    transform: Optional[str] = None  # "module:function" record -> messages (overrides the fields)
    train_on: TrainOn = TrainOn.assistant
    max_length: int = 1024  # longer conversations are truncated on the right


@dataclass
class GenerationEvalConfig:
    """Greedy samples on held-out prompts, scored by a reward (e.g. final-answer accuracy)."""

    examples: int = 0  # 0 = off; else the first N eval records
    max_tokens: int = 256
    every: int = 0  # 0 = at the first and the last evaluation only
    reward: Any = None  # {_target_: ...}: (completion, record) -> float | RewardResult


@dataclass
class SFTConfig(LoopConfig):
    """Supervised fine-tuning on conversations (``rlkit.loops.sft.train_sft``)."""

    epochs: int = 1  # used when ``steps`` is null
    batch_tokens: int = 4096  # tokens (prompt included) per optimizer step
    aggregation: Aggregation = Aggregation.token_mean
    aggregation_constant: Optional[float] = None  # the divisor when aggregation=constant
    shuffle: bool = True
    eval_batch_tokens: int = 8192
    format: ChatFormatConfig = field(default_factory=ChatFormatConfig)
    generate: GenerationEvalConfig = field(default_factory=GenerationEvalConfig)


# -- the root ------------------------------------------------------------------------------------------


@dataclass
class Config:
    """The root of every run's config."""

    recipe: Optional[str] = None  # set from the ``recipe=`` choice
    loop: str = MISSING  # a key of rlkit.loops.LOOPS
    seed: int = 0
    run_dir: Optional[str] = None  # null = runs/<recipe>/<timestamp>
    resume: Optional[str] = None  # a run directory to continue
    backend: Any = MISSING  # typed by the backend's schema
    model: ModelConfig = MISSING
    loss: Any = None  # {_target_: a Loss class, ...}
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    verbose: bool = False  # libraries' own progress bars and notes (transformers, matplotlib) on the console
    cost_preview: bool = False  # print `rlkit cost`'s token estimate for this run before it starts (RL recipes)
    data: Optional[DataConfig] = None
    train: Any = MISSING  # typed by the loop's schema (LoopConfig subclass)


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    """``ConfigError("config key 'key': value ... rule")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"config key '{key}': {value!r} {rule}")


def check_finite(node: Any, path: str = "") -> None:
    """Refuse ``nan``/``inf`` anywhere in a (resolved) config, naming the key."""
    if isinstance(node, dict):
        for k, v in node.items():
            check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_finite(v, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"config key '{path}': {node} is not a finite number")


def check_values(cfg: Any) -> None:
    """What types cannot say: every number finite, and the loop's own ranges (``train.check()``)."""
    from omegaconf import OmegaConf

    check_finite(OmegaConf.to_container(cfg, resolve=True))
    train = OmegaConf.to_object(cfg.train)
    if isinstance(train, LoopConfig):
        train.check()


def import_string(path: str, where: str = "") -> Any:
    """``"package.module:attribute"`` (or ``"package.module.attribute"``) -> the attribute, with the
    working directory importable (:func:`rlkit.imports.import_object`)."""
    from rlkit.imports import import_object

    return import_object(path, where)


def instantiate_config(spec: Any, where: str) -> Any:
    """``hydra.utils.instantiate(spec)``, its ``_target_`` (and nested ones) resolved and keywords
    checked first (:func:`rlkit.imports.check_target_spec`); a failure is one :class:`ConfigError` line."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rlkit.imports import check_target_spec

    check_target_spec(OmegaConf.to_container(spec, resolve=True) if OmegaConf.is_config(spec) else spec, where)
    try:
        return instantiate(spec)
    except RlkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bad _target_ or argument is a config error
        target = spec.get("_target_") if hasattr(spec, "get") else None
        reason = " ".join(str(exc.__cause__ or exc).split())
        raise ConfigError(f"{where}: cannot instantiate {target!r}: {reason}") from None


def store_base_schemas() -> None:
    """Store the root, backend and loss schemas in Hydra's ConfigStore (the loop registry,
    :func:`rlkit.loops.register_configs`, adds each loop's ``train`` schema). A loss's node is its
    class's own ``_target_`` and defaults (:func:`rlkit.losses.registry.config_node`), untyped like
    any loss config (``+loss.key=value`` adds an argument it does not show), so a
    ``configs/loss/<name>.yaml`` composes ``/schema/loss/<name>`` instead of repeating a default."""
    from hydra.core.config_store import ConfigStore

    from rlkit.losses.registry import LOSSES, config_node

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for name, schema in backend_schemas().items():
        cs.store(group="schema/backend", name=name, node=schema)
    for name, cls in LOSSES.items():
        cs.store(group="schema/loss", name=name, node=config_node(cls))


def check_keys(node: Any, path: str = "") -> None:
    """Refuse keys a typed node's dataclass does not declare (``+key=value`` can add them)."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    if not isinstance(node, DictConfig):
        return
    schema = OmegaConf.get_type(node)
    declared = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in node.keys():
        full = f"{path}.{key}" if path else str(key)
        if declared is not None and key not in declared:
            from rlkit.imports import suggest

            raise ConfigError(f"unknown config key '{full}': Key '{key}' not in '{schema.__name__}'{suggest(str(key), declared)}")
        if declared is not None or path == "":
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                check_keys(child, full)


def key_hint(cause: Any, key: str, text: str = "") -> str:
    """For an unknown key: ``"; did you mean 'x'?"`` (the nearest key its node declares or holds, or
    a parameter of the node's ``_target_``), and for a node that takes new keys (not a typed schema)
    given one without ``+``, how to add it."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    from rlkit.imports import import_object, parameters, suggest

    import re
    import sys

    name = key.rsplit(".", 1)[-1]
    parent = getattr(cause, "parent_node", None)
    schema = getattr(cause, "object_type", None)
    named = re.search(r"not in '(\w+)'", text)
    if not dataclasses.is_dataclass(schema) and named:  # a YAML file's error: only the schema's name survives
        found = (getattr(m, named.group(1), None) for n, m in list(sys.modules.items()) if n.startswith("rlkit."))
        schema = next((c for c in found if isinstance(c, type) and dataclasses.is_dataclass(c)), schema)
    candidates: List[str] = []
    if dataclasses.is_dataclass(schema):
        candidates += [f.name for f in dataclasses.fields(schema)]
    elif isinstance(parent, DictConfig) and OmegaConf.get_type(parent) is not None and dataclasses.is_dataclass(OmegaConf.get_type(parent)):
        schema = OmegaConf.get_type(parent)
        candidates += [f.name for f in dataclasses.fields(schema)]
    if isinstance(parent, DictConfig):
        candidates += [str(k) for k in parent.keys() if str(k) not in candidates and not str(k).startswith("_")]
        target = parent._get_node("_target_") if "_target_" in parent else None
        target = None if target is None or target._is_interpolation() else target._value()
        if isinstance(target, str):
            try:
                candidates += [k for k in parameters(import_object(target))[0] if k not in candidates]
            except Exception:  # noqa: BLE001 - a hint only; the target is checked later on its own
                pass
    hint = suggest(name, [c for c in candidates if c != name])
    typed = dataclasses.is_dataclass(schema)
    if not typed and "To append to your config use +" in text:
        hint += f"; to add a new key, use +{key}=VALUE"
    return hint


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe_config_error(exc: BaseException) -> str:
    """One line naming what is wrong with a config and where, from a Hydra/OmegaConf error."""
    import re

    from omegaconf.errors import OmegaConfBaseException

    cause: Optional[BaseException] = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    text = "\n".join(str(e) for e in (exc, cause) if e is not None)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Set the environment")]
    first = lines[0] if lines else type(exc).__name__
    file_match = re.match(r"In '([^']+)': (.*)", first)
    where = f" (in {file_match.group(1)}.yaml)" if file_match and file_match.group(1) != "config" else ""
    key_match = re.search(r"full_key: (\S+)", text)
    key = getattr(cause, "full_key", None) or (key_match.group(1) if key_match else "")
    if key:
        msg = getattr(cause, "msg", None) or ""
        if not msg:
            msg = next((ln for ln in lines if re.match(r"(Key '|Value '|Invalid value|Missing mandatory|Unsupported|Incompatible)", ln)), first)
        msg = msg.splitlines()[0]
        if "not in struct" in msg or "not in '" in msg:
            return f"unknown config key '{key}'{where}: {msg}{key_hint(cause, str(key), text)}"
        return f"config key '{key}'{where}: {msg}"
    missing = re.match(r"(?:In '[^']+': )?Could not find '([^']+)/([^'/]+)'", first)
    if missing:
        group, name = missing.groups()
        options = [ln for ln in lines[1:] if not ln.startswith(("Available", "Config search", "provider=", "In "))]
        kind = "recipe" if group == "recipe" else f"{group} option"
        if group.startswith("hydra/"):  # a sweeper or launcher named on the command line
            where = ""
        from rlkit.imports import suggest

        near = suggest(name, options)
        near = f" ({near[2:]})" if near else ""
        return f"unknown {kind} '{name}'{where}{near}; available: {', '.join(options) or 'none'}"
    if first.startswith("You must specify 'recipe'"):
        options = [ln for ln in lines[1:] if not ln.startswith("Available")]
        return f"no recipe given: rlkit train recipe=NAME ... (available: {', '.join(options)})"
    return " ".join(lines[:3])
