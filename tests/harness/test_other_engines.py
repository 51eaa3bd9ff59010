"""The ``rlkit`` lm-eval model on another engine: Tinker's API (here rlkit's own Tinker-compatible
server, driven through the official tinker SDK), giving the local engine's numbers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a server

pytest.importorskip("tinker", reason="needs the tinker SDK (pip install 'rlkit[tinker]')")


def test_tinker_backend_matches_local(tmp_path):
    from lm_eval.api.instance import Instance

    from rlkit.backends.local.models import TINY_TOKENIZER_DIR
    from rlkit.backends.tinker.server import TinkerServer
    from rlkit.harness.model import RlkitLM

    server = TinkerServer(state_dir=str(tmp_path), long_poll_s=2.0).start()
    remote = local = None
    try:
        remote = RlkitLM(model="tiny", backend="tinker", base_url=server.url, api_key="tml-test", tokenizer=str(TINY_TOKENIZER_DIR))
        local = RlkitLM(model="tiny", precision="fp32")
        scores = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate([("Question: 2+2?\nAnswer:", " 4"), ("Hello", " world")])]
        texts = [Instance("generate_until", {}, ("Once upon a time", {"until": ["\n\n"], "do_sample": False, "max_gen_toks": 12}), 0)]
        for (a, ga), (b, gb) in zip(remote.loglikelihood(scores), local.loglikelihood(scores)):
            assert abs(a - b) < 1e-4 and ga == gb
        assert remote.generate_until(texts) == local.generate_until(texts)
    finally:
        for lm in (remote, local):
            if lm is not None:
                lm.close()
        server.stop()
