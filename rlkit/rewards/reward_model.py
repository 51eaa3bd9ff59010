"""A reward model: a Hugging Face sequence-classification model scored locally, in batches.

:class:`RewardModel` renders ``(question, completion)`` as a chat (the tokenizer's own template:
user = the problem's question, assistant = the completion; plain ``question\\n\\ncompletion`` for a
tokenizer without one), tokenizes with right truncation to ``max_length``, and takes the logit of
``label`` (a single-logit model's only output) as the score, optionally squashed by a sigmoid.

- :meth:`RewardModel.score` scores a list of pairs ``batch_size`` at a time (padded batches under
  ``torch.no_grad``); it is what the ``scored`` task's groups call once per group
  (:class:`rlkit.tasks.scored.ScoredTask`), so a GRPO group of G completions is one forward.
- ``__call__(completion, problem)`` is the plain reward protocol (one pair).

``model`` is a path or hub id (``AutoModelForSequenceClassification.from_pretrained``; offline,
a local path) or an already-built model, with ``tokenizer`` beside it. Reward models trained as
Bradley-Terry scorers (e.g. Skywork-Reward, ArmoRM's head) give unbounded logits: use
``normalize: sigmoid`` or a ``WeightedSum`` weight to keep the scale comparable to task rewards.
"""

from __future__ import annotations

import threading
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult


class RewardModel:
    name = "reward_model"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        batch_size: int = 8,
        max_length: int = 1024,
        label: int = 0,
        normalize: Optional[str] = None,
        device: str = "cpu",
        question_key: str = "question",
        use_chat_template: bool = True,
    ):
        if normalize not in (None, "sigmoid"):
            raise ConfigError(f"reward_model.normalize={normalize!r}: null or sigmoid")
        if batch_size < 1 or max_length < 2:
            raise ConfigError(f"reward_model: batch_size={batch_size} >= 1 and max_length={max_length} >= 2")
        if isinstance(model, str):
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            path = model
            model = AutoModelForSequenceClassification.from_pretrained(path)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        if tokenizer is None:
            raise ConfigError("reward_model: an already-built model needs its tokenizer (tokenizer=...)")
        num_labels = int(getattr(model.config, "num_labels", 1))
        if not 0 <= label < num_labels:
            raise ConfigError(f"reward_model.label={label}: the model has {num_labels} output(s)")
        self.model = model.to(device).eval()
        self.tokenizer, self.device = tokenizer, device
        self.batch_size, self.max_length, self.label, self.normalize = int(batch_size), int(max_length), int(label), normalize
        self.question_key, self.use_chat_template = question_key, use_chat_template
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = self._pad  # sequence classification finds each row's last token by the pad id
        self._lock = threading.Lock()  # one forward at a time (rollout threads share the model)

    def encode(self, question: str, completion: str) -> List[int]:
        if self.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            from rlkit.chat import render_ids

            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": completion}]
            ids = render_ids(self.tokenizer, messages, add_generation_prompt=False)
        else:
            ids = self.tokenizer(f"{question}\n\n{completion}", add_special_tokens=True)["input_ids"]
        return list(ids)[: self.max_length]

    def score(self, pairs: Sequence[Tuple[str, str]]) -> List[float]:
        """One score per ``(question, completion)``, ``batch_size`` pairs per forward."""
        import torch

        out: List[float] = []
        encoded = [self.encode(q, c) for q, c in pairs]
        with self._lock, torch.no_grad():
            for start in range(0, len(encoded), self.batch_size):
                rows = encoded[start: start + self.batch_size]
                width = max(len(r) for r in rows)
                ids = torch.full((len(rows), width), self._pad, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for i, r in enumerate(rows):
                    ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
                    mask[i, : len(r)] = 1
                logits = self._logits(ids.to(self.device), mask.to(self.device), [len(r) for r in rows])
                values = logits[:, self.label].float()
                if self.normalize == "sigmoid":
                    values = torch.sigmoid(values)
                out.extend(float(v) for v in values.cpu())
        return out

    def _logits(self, ids: Any, mask: Any, lengths: List[int]) -> Any:
        """The classification logits at each row's last real token (right padding; the pad id may
        also occur inside a row, so the position comes from the mask, not from the pad id)."""
        import torch

        base = getattr(self.model, self.model.base_model_prefix, None)
        head = getattr(self.model, "score", None)
        if base is None or head is None:  # not a *ForSequenceClassification with a .score head: trust the model
            return self.model(input_ids=ids, attention_mask=mask).logits
        hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
        last = torch.tensor([n - 1 for n in lengths], device=hidden.device)
        return head(hidden[torch.arange(len(lengths), device=hidden.device), last])

    def score_batch(self, completions: Sequence[str], problems: Sequence[Mapping[str, Any]]) -> List[RewardResult]:
        scores = self.score([(str(p.get(self.question_key, "")), c) for c, p in zip(completions, problems)])
        return [RewardResult(reward=s, metrics={"reward_model/score": s}) for s in scores]

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        return self.score_batch([completion], [problem])[0]
