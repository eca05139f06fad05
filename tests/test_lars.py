import copy

import numpy as np
import pytest
import torch
import torchvision

from optim import build_optimizer
from optim.lars import LARS
from optim.params import is_skipped, param_groups
from optim.schedule import Schedule

WD, MOMENTUM, ETA = 5e-5, 0.9, 0.001


def reference_step(w, v, g, lr, skipped):
    """The MLPerf reference LARS update for one parameter, in NumPy."""
    if skipped:
        v = MOMENTUM * v + lr * g
        return w - v, v
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    trust = ETA * w_norm / (g_norm + WD * w_norm) if w_norm > 0 and g_norm > 0 else 1.0
    g = g + WD * w
    v = MOMENTUM * v + lr * trust * g
    return w - v, v


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    ).double()


def lars(model: torch.nn.Module, lr: float = 1.0) -> LARS:
    return LARS(param_groups(model, WD), lr=lr, momentum=MOMENTUM, eta=ETA)


def set_grads(model: torch.nn.Module, rng: np.random.Generator) -> None:
    for p in model.parameters():
        p.grad = torch.from_numpy(rng.normal(scale=0.01, size=tuple(p.shape)))


def test_matches_numpy_reference_under_warmup_and_poly_decay():
    model = small_model()
    opt = lars(model)
    schedule = Schedule(base_lr=8.0, warmup_steps=10, decay_steps=50)
    names = [n for n, _ in model.named_parameters()]
    skipped = {n: is_skipped(n, p) for n, p in model.named_parameters()}
    assert sorted(n for n in names if skipped[n]) == ["1.bias", "1.weight", "3.bias"]
    w = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    v = {n: np.zeros_like(w[n]) for n in names}
    rng = np.random.default_rng(0)
    for step in range(60):
        lr = schedule(step)
        set_grads(model, rng)
        for n, p in model.named_parameters():
            w[n], v[n] = reference_step(w[n], v[n], p.grad.numpy(), lr, skipped[n])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    for n, p in model.named_parameters():
        assert np.abs(p.detach().numpy() - w[n]).max() < 1e-6, n
        assert not np.allclose(w[n], small_model().state_dict()[n].numpy()), n  # the weights did move


def test_zero_gradient_or_weight_uses_trust_one():
    w = torch.nn.Parameter(torch.full((4, 4), 0.5, dtype=torch.float64))
    zero = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    opt = LARS([w, zero], lr=0.1, momentum=MOMENTUM, weight_decay=WD, eta=ETA)
    w.grad = torch.zeros_like(w)
    zero.grad = torch.ones_like(zero)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full_like(w, 0.5 * (1 - 0.1 * WD)), rtol=0, atol=1e-15)
    torch.testing.assert_close(zero.detach(), torch.full_like(zero, -0.1), rtol=0, atol=1e-15)
    zero.data.zero_()
    zero.grad.zero_()
    opt.step()
    assert torch.isfinite(w).all() and torch.isfinite(zero).all()


def test_skipped_group_gets_no_weight_decay_or_trust():
    model = small_model()
    opt = lars(model, lr=0.5)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["bn_bias"]["weight_decay"] == 0.0 and groups["bn_bias"]["trust"] is False
    assert groups["weights"]["weight_decay"] == WD and groups["weights"]["trust"] is True
    set_grads(model, np.random.default_rng(1))
    before = [p.detach().clone() for p in groups["bn_bias"]["params"]]
    opt.step()
    for p, b in zip(groups["bn_bias"]["params"], before, strict=True):
        torch.testing.assert_close(p.detach(), b - 0.5 * p.grad, rtol=0, atol=1e-15)


def test_state_dict_round_trip_continues_identically():
    model = small_model()
    opt = lars(model)
    rng = np.random.default_rng(2)
    for _ in range(3):
        set_grads(model, rng)
        opt.step()
    model2 = copy.deepcopy(model)
    opt2 = lars(model2)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for _ in range(3):
        set_grads(model, rng)
        for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
            p2.grad = p.grad.clone()
        opt.step()
        opt2.step()
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, p2)


def test_step_with_closure_returns_loss():
    model = small_model()
    opt = lars(model)
    x = torch.randn(2, 3, 3, 3, dtype=torch.float64)

    def closure():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss is not None and all(p.grad is not None for p in model.parameters())


def test_build_optimizer_rejects_unknown_name():
    with pytest.raises(ValueError, match="lars, sgd"):
        build_optimizer("adam", small_model(), lr=0.1, momentum=0.9, weight_decay=WD)


@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_build_optimizer_groups_resnet18(name):
    model = torchvision.models.resnet18()
    opt = build_optimizer(name, model, lr=0.1, momentum=0.9, weight_decay=WD)
    assert isinstance(opt, torch.optim.SGD if name == "sgd" else LARS)
    groups = {g["name"]: g for g in opt.param_groups}
    skipped = {id(p) for p in groups["bn_bias"]["params"]}
    expected = {id(p) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()}
    assert skipped == expected | {id(model.fc.bias)}
    assert groups["bn_bias"]["weight_decay"] == 0.0 and groups["weights"]["weight_decay"] == WD
    assert len(skipped) + len(groups["weights"]["params"]) == len(list(model.parameters()))
