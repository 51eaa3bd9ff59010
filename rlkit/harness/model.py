"""``rlkit``: an lm-evaluation-harness model backed by an rlkit session, on any engine.

    lm_eval --model rlkit --model_args model=tiny,precision=fp32 --tasks gsm8k     (see rlkit.harness)
    lm = RlkitLM(model="smollm2-135m-instruct", checkpoint="runs/x/checkpoints/step-30")
    lm = RlkitLM(client=trainer.save_weights_and_get_sampling_client())             # live weights

Model arguments: ``model`` (the base model), ``checkpoint=DIR`` or ``run=DIR`` (see
:mod:`rlkit.harness.weights`), ``backend`` (``local`` by default, ``tinker``, ``sagemaker``),
lm-eval's own ``max_length``, ``max_gen_toks`` (256), ``add_bos_token``, ``prefix_token_id``,
``think_end_token``, ``chat_template_args``; every other argument is an engine option handed to
``rlkit.connect(backend, ...)`` (the local engine's ``precision``, ``device``, ``max_batch_rows``,
``num_threads``, ``sampler``, ...). lm-eval's ``batch_size`` is accepted and not used: the
engine batches everything in flight (``max_batch_rows`` rows at a time on the local engine).

The three request kinds run on the session primitives (:mod:`rlkit.harness.engine_calls`):
``loglikelihood`` and ``loglikelihood_rolling`` on ``compute_logprobs`` (``is_greedy`` by a greedy
``sample`` where the scores alone cannot tell and lm-eval reads it: ``greedy_check=auto|all|none``), ``generate_until`` on ``sample`` with the stop
sequences as ``SamplingParams.stop`` and ``temperature=0`` unless the task samples. Tokenisation,
truncation, stop handling and the chat template follow lm-eval's ``hf`` model (``HFLM``) line
for line, so the same weights give the same requests, the same loglikelihoods (up to float
rounding) and the same greedy text.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Tuple

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    _add_special_kwargs,
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
)

from rlkit.harness import engine_calls
from rlkit.harness.weights import Weights, resolve_weights

log = logging.getLogger("rlkit.harness")

DEFAULT_MAX_LENGTH = 2048  # HFLM's, when neither the engine nor the tokenizer knows a context length
TOKENIZER_INFINITY = 1000000000000000019884624838656  # transformers' "model_max_length not set"
SURE_GREEDY = math.log(0.5)  # a token above probability 1/2 is the argmax: no greedy check needed


@register_model("rlkit")
class RlkitLM(TemplateLM):
    """lm-eval's ``LM`` over an rlkit sampling client (see the module docstring)."""

    backend = "causal"

    def __init__(
        self,
        model: Optional[str] = None,
        checkpoint: Optional[str] = None,
        run: Optional[str] = None,
        backend: str = "local",
        *,
        client: Any = None,
        weights: Optional[Weights] = None,
        max_length: Optional[int] = None,
        max_gen_toks: int = 256,
        add_bos_token: Optional[bool] = None,
        prefix_token_id: Optional[int] = None,
        think_end_token: Optional[str] = None,
        greedy_check: str = "auto",
        chat_template_args: Optional[Dict[str, Any]] = None,
        batch_size: Any = None,  # lm-eval passes it; the engine batches what is in flight
        max_batch_size: Any = None,
        device: Optional[str] = None,
        **engine_options: Any,
    ):
        super().__init__()
        self.service = None
        if client is None:
            self.weights = weights or resolve_weights(model, checkpoint, run)
            if device is not None and backend == "local" and _device_available(str(device)):
                engine_options.setdefault("device", device)
            self.service, client = open_client(backend, self.weights, engine_options)
        else:
            self.weights = Weights(base_model=str(model or getattr(client, "base_model", "") or "unknown"),
                                   checkpoint=str(getattr(client, "weights_key", "") or ""))
        self.client = client
        self.backend_name = backend
        self.tokenizer = client.get_tokenizer()
        self._max_length = int(max_length) if max_length else None
        self._max_gen_toks = int(max_gen_toks)
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        self.think_end_token = think_end_token
        if greedy_check not in ("auto", "all", "none"):
            from rlkit.errors import ConfigError

            raise ConfigError(f"greedy_check={greedy_check!r}: choose auto, all or none")
        self.greedy_check = greedy_check
        self._greedy_wanted: Optional[List[bool]] = None
        self.chat_template_args = dict(chat_template_args or {})
        # the engine's own end-of-turn tokens end a decode; the local engine can be told to run on
        self._no_stop_tokens = [] if "stop_token_ids" in getattr(client, "extensions", ()) else None
        log.info("rlkit lm-eval model: %s on %s", self.weights.describe(), backend)

    # -- what lm-eval asks of a model ------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return int(self.custom_prefix_token_id)
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return self._max_length
        window = getattr(self.client, "max_positions", None)
        if window:
            return int(window)
        model_max = getattr(self.tokenizer, "model_max_length", None)
        if model_max and model_max != TOKENIZER_INFINITY:
            return int(model_max)
        return DEFAULT_MAX_LENGTH

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, left_truncate_len: Optional[int] = None,
                   **kwargs: Any) -> List[int]:
        """HFLM's ``tok_encode``: the tokenizer's own special tokens unless ``add_bos_token`` says
        otherwise, none when the text already starts with the prefix token."""
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        encoding = self.tokenizer.encode(string, **special)
        return encoding[-left_truncate_len:] if left_truncate_len else encoding

    def _prompt_encode(self, string: str, left_truncate_len: int) -> List[int]:
        """HFLM's ``tok_batch_encode`` for one generation context (no padding: each request is its own)."""
        special: Dict[str, Any] = {}
        if has_bos_prefix(string, getattr(self.tokenizer, "bos_token", None)):
            special = {"add_special_tokens": False}
        elif self.add_bos_token is not None:
            special = {"add_special_tokens": self.add_bos_token}
        ids = self.tokenizer(string, **special)["input_ids"]
        if len(ids) > left_truncate_len:
            log.warning("left truncation: a prompt of %d tokens keeps its last %d", len(ids), left_truncate_len)
        return list(ids[-left_truncate_len:])

    def tok_decode(self, tokens: Any, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: List[Dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The tokenizer's chat template as HFLM applies it (a template that refuses a system turn
        is retried without it)."""
        import jinja2

        def render(history: List[Dict[str, str]]) -> str:
            return self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                      continue_final_message=not add_generation_prompt, **self.chat_template_args)

        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:
            log.warning("the chat template refused the history; retrying without the system turn")
            return render([m for m in chat_history if m["role"] != "system"])

    def get_model_info(self) -> Dict[str, Any]:
        info: Dict[str, Any] = {"rlkit_base_model": self.weights.base_model, "rlkit_backend": self.backend_name}
        if self.weights.checkpoint:
            info["rlkit_checkpoint"] = self.weights.checkpoint
            info["rlkit_step"] = self.weights.step
        precision = getattr(self.service, "precision", None)
        if precision:
            info["rlkit_precision"] = precision
        return info

    # -- loglikelihoods ----------------------------------------------------------------------------------
    def loglikelihood(self, requests: List[Any], disable_tqdm: bool = False) -> List[Tuple[float, bool]]:
        """TemplateLM's (context/continuation split as HFLM splits), with the requests whose
        ``is_greedy`` lm-eval reads marked (:meth:`_wants_greedy`)."""
        self._greedy_wanted = self._wants_greedy(requests)
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._greedy_wanted = None

    def _wants_greedy(self, requests: List[Any]) -> List[bool]:
        """Which requests need an exact ``is_greedy``: ``greedy_check=all`` every one, ``none`` none,
        ``auto`` those alone for their document (a ``loglikelihood`` task's one request; a
        ``multiple_choice`` task asks one per choice and never reads ``is_greedy``). Unchecked
        requests report ``True`` only where the scores alone prove it."""
        if self.greedy_check != "auto":
            return [self.greedy_check == "all"] * len(requests)
        counts: Dict[Tuple[Any, Any], int] = {}
        keys = [(getattr(r, "task_name", None), getattr(r, "doc_id", None)) for r in requests]
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        return [key == (None, None) or counts[key] == 1 for key in keys]

    def _loglikelihood_tokens(self, requests: List[Tuple[Any, List[int], List[int]]], disable_tqdm: bool = False,
                              greedy: bool = True, **kwargs: Any) -> List[Tuple[float, bool]]:
        """``(sum of the continuation's logprobs, is_greedy)`` per ``((context, continuation),
        context_enc, continuation_enc)``, windowed as HFLM windows them: the last ``max_length + 1``
        tokens (the engine scores one more token than a prompt may hold, exactly for this)."""
        windows, conts = [], []
        for _, context_enc, continuation_enc in requests:
            if not context_enc or not continuation_enc or len(continuation_enc) > self.max_length:
                raise ValueError("lm-eval request with an empty context or continuation, or a continuation over max_length")
            windows.append((context_enc + continuation_enc)[-(self.max_length + 1):])
            conts.append(continuation_enc)
        scored = engine_calls.score(self.client, windows, disable_tqdm=disable_tqdm)
        picked = [[float(v) for v in values[-len(cont):]] for values, cont in zip(scored, conts)]  # type: ignore[arg-type]
        wanted = self._greedy_wanted if greedy and self._greedy_wanted is not None else [greedy] * len(windows)
        is_greedy = self._is_greedy(windows, conts, picked, wanted)
        answers = [(sum(lps), g) for lps, g in zip(picked, is_greedy)]
        for (request_str, _, _), answer in zip(requests, answers):
            if request_str is not None:  # rolling windows are cached per document instead
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
        return answers

    def _is_greedy(self, windows: List[List[int]], conts: List[List[int]], picked: List[List[float]],
                   wanted: List[bool]) -> List[bool]:
        """lm-eval's ``is_greedy`` (every continuation token the argmax): sure from the scores while
        each token's probability is above 1/2; from the first token that is not, a greedy decode
        (for ``wanted`` requests; one per distinct prompt, shared by the continuations that need it)."""
        result = [all(lp > SURE_GREEDY for lp in lps) for lps in picked]
        asks: Dict[int, Tuple[Tuple[int, ...], int]] = {}  # request -> (prompt to decode from, where its continuation resumes)
        for i, (window, cont, lps) in enumerate(zip(windows, conts, picked)):
            if result[i] or not wanted[i]:
                continue
            start = next(k for k, lp in enumerate(lps) if lp <= SURE_GREEDY)  # the tokens before it are the argmax
            prompt = tuple(window[: len(window) - len(cont) + start])
            if len(prompt) < self.max_length:  # else no room to decode after it: only the sure answer stands
                asks[i] = (prompt, start)
        wanted_tokens: Dict[Tuple[int, ...], int] = {}
        for i, (prompt, start) in asks.items():
            wanted_tokens[prompt] = max(wanted_tokens.get(prompt, 0), len(conts[i]) - start)
        if not wanted_tokens:
            return result
        decoded = engine_calls.greedy_tokens(self.client, wanted_tokens, stop_token_ids=self._no_stop_tokens)
        for i, (prompt, start) in asks.items():
            rest = list(conts[i][start:])
            result[i] = decoded[prompt][: len(rest)] == rest
        return result

    def loglikelihood_rolling(self, requests: List[Any], disable_tqdm: bool = False) -> List[float]:
        """HFLM's rolling windows (``max_length`` tokens, context 1), every window of every
        document scored in one round."""
        from lm_eval import utils

        windows: List[Tuple[Any, List[int], List[int]]] = []
        owner: List[int] = []
        for i, (string,) in enumerate(req.args for req in requests):
            rolling = utils.get_rolling_token_windows(token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                                                      max_seq_len=self.max_length, context_len=1)
            for context, continuation in map(utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm, greedy=False)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, scores):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation -----------------------------------------------------------------------------------
    def generate_until(self, requests: List[Any], disable_tqdm: bool = False) -> List[str]:
        """Every request submitted at once as ``sample`` (greedy unless ``do_sample``), stop
        sequences as ``SamplingParams.stop``; the text is cut at the first stop sequence as HFLM cuts it."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        jobs, stops = [], []
        for context, gen_kwargs in (req.args for req in requests):
            if not isinstance(gen_kwargs, dict):
                raise ValueError(f"generation kwargs must be a dict, got {gen_kwargs!r}")
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)  # type: ignore[misc]
            max_gen_toks = int(kwargs.pop("max_gen_toks"))  # type: ignore[misc]
            room = self.max_length - max_gen_toks
            if room <= 0:
                raise ValueError(f"max_gen_toks={max_gen_toks} leaves no room for a prompt in max_length={self.max_length}")
            jobs.append((self._prompt_encode(context, room), engine_calls.sampling_params(dict(kwargs), max_gen_toks, until)))
            stops.append(until)
        outputs = engine_calls.generate(self.client, jobs, disable_tqdm=disable_tqdm)
        results = []
        for req, tokens, until in zip(requests, outputs, stops):
            text = postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=self.think_end_token)
            self.cache_hook.add_partial("generate_until", req.args, text)
            results.append(text)
        return results

    def close(self) -> None:
        """Stop the service this model opened (not a client it was handed)."""
        if self.service is not None:
            self.service.close()
            self.service = None


def _device_available(device: str) -> bool:
    """lm-eval's ``--device`` (its CLI passes ``cuda:0`` unless told): used where it exists; else,
    as lm-eval's ``hf`` model does, the engine's own choice (CUDA when available, else the CPU)."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("device=%s: no CUDA device here; the engine chooses (the CPU)", device)
        return False
    return True


def unknown_option(backend: str, options: Dict[str, Any], exc: TypeError) -> str:
    """One line for a model argument that neither rlkit eval, lm-eval nor the engine takes: its name,
    the closest key that exists (``out=`` -> ``output=``), and the engine's own options."""
    import dataclasses
    import difflib
    import re

    from rlkit.engine.registry import backend_spec
    from rlkit.harness.weights import EVAL_KEYS, WEIGHT_KEYS

    found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if found is None or found.group(1) not in options:
        return f"backend={backend}: {exc} (model args other than lm-eval's are engine options)"
    name = found.group(1)
    spec = backend_spec(backend)
    engine = sorted(f.name for f in dataclasses.fields(spec.schema_class()) if f.name != "name") if spec.schema else []
    near = difflib.get_close_matches(name, sorted({*EVAL_KEYS, *WEIGHT_KEYS, *engine}), n=1)
    hint = f" (did you mean {near[0]}=?)" if near else ""
    known = f"; the {backend} engine's options: {', '.join(engine)}" if engine else ""
    return f"{name}={options[name]!r}: not an option of rlkit eval, lm-eval or the {backend} engine{hint}{known}"


def open_client(backend: str, weights: Weights, options: Dict[str, Any]) -> Tuple[Any, Any]:
    """``rlkit.connect(backend, **options)`` and a sampling client on ``weights``; an option the
    engine does not take is one line naming it."""
    import rlkit
    from rlkit.errors import ConfigError

    try:
        service = rlkit.connect(backend, **options)
    except TypeError as exc:
        raise ConfigError(unknown_option(backend, options, exc)) from None
    try:
        if weights.checkpoint:
            client = service.create_sampling_client(model_package_arn=weights.checkpoint)
        else:
            client = service.create_sampling_client(base_model=weights.base_model)
    except BaseException:
        service.close()
        raise
    return service, client
