"""The chunked output-layer logprob function against plain autograd: values and gradients, with
per-row temperatures, a bias, chunks smaller than the batch, and bf16 products."""

import torch

from rlkit.backends.local.logprobs import TargetLogprobs, target_logprobs


def reference(hidden, weight, targets, temperature, bias=None):
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    logits = logits / temperature.unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def case(seed, n=7, d=5, v=11, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, d, generator=g, dtype=dtype)
    bias = torch.randn(v, generator=g, dtype=dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    temperature = torch.rand(n, generator=g, dtype=dtype) + 0.5
    return hidden, weight, bias, targets, temperature


def test_values_and_gradients_match_autograd_in_every_chunking():
    for seed, chunk in [(0, 1), (1, 3), (2, 7), (3, 100)]:
        hidden, weight, bias, targets, temperature = case(seed)
        for b in (None, bias):
            want = reference(hidden, weight, targets, temperature, b)
            got = target_logprobs(hidden, weight, targets, temperature, bias=b, chunk_rows=chunk)
            assert torch.allclose(got.double(), want, atol=1e-6)  # the function returns float32
            upstream = torch.randn(hidden.shape[0], dtype=hidden.dtype, generator=torch.Generator().manual_seed(seed))
            (g_want,) = torch.autograd.grad(want, hidden, upstream)
            (g_got,) = torch.autograd.grad(got, hidden, upstream.float())
            assert torch.allclose(g_got, g_want, atol=1e-5), (seed, chunk)


def test_hand_computed_value_and_gradient():
    # one row, d = 1, V = 2, W = [[1], [0]], h = 0, T = 1: logits (0, 0) -> logprob of token 0 = -log 2;
    # d/dh = (W[0] - E_p[W]) / T = 1 - 0.5 = 0.5, and at T = 2 it is 0.25
    weight = torch.tensor([[1.0], [0.0]])
    for temperature, slope in ((1.0, 0.5), (2.0, 0.25)):
        hidden = torch.zeros(1, 1, requires_grad=True)
        out = target_logprobs(hidden, weight, torch.tensor([0]), torch.tensor([temperature]))
        assert abs(out.item() + torch.log(torch.tensor(2.0)).item()) < 1e-7
        out.sum().backward()
        assert abs(hidden.grad.item() - slope) < 1e-7


def test_gradcheck_float64():
    hidden, weight, bias, targets, temperature = case(5, n=4, d=3, v=6)
    inv = 1.0 / temperature

    def fn(h):
        return TargetLogprobs.apply(h, weight, bias, targets, inv, torch.float64, 3).double()

    # the function stores float32 results; gradcheck on float64 inputs with a float32-sized tolerance
    assert torch.autograd.gradcheck(fn, (hidden,), eps=1e-4, atol=1e-3, rtol=1e-3)


def test_bf16_products_stay_close_and_no_grad_skips_the_expectation():
    hidden, weight, _, targets, temperature = case(7, n=16, d=32, v=64, dtype=torch.float32)
    want = reference(hidden, weight, targets, temperature)
    got = target_logprobs(hidden, weight, targets, temperature, compute_dtype=torch.bfloat16)
    assert (got - want).abs().max() < 0.1
    with torch.no_grad():
        plain = target_logprobs(hidden, weight, targets, temperature)
    assert not plain.requires_grad and torch.allclose(plain, want, atol=1e-5)
