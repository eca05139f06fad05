import copy

import numpy as np
import pytest
import torch
import torchvision

from optim.lars import LARS
from optim.optimizers import build_optimizer
from optim.params import is_skipped, param_groups
from optim.schedule import Schedule

WD, MOMENTUM, ETA = 5e-5, 0.9, 0.001
# foreach=False is the per-parameter statement of the equations; foreach=True must compute the same
both_paths = pytest.mark.parametrize("foreach", [False, True], ids=["per_param", "foreach"])


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


def lars(model: torch.nn.Module, lr: float | torch.Tensor = 1.0, foreach: bool | None = True) -> LARS:
    return LARS(param_groups(model, WD), lr=lr, momentum=MOMENTUM, eta=ETA, foreach=foreach)


def set_grads(model: torch.nn.Module, rng: np.random.Generator) -> None:
    for p in model.parameters():
        p.grad = torch.from_numpy(rng.normal(scale=0.01, size=tuple(p.shape))).to(p.dtype)


def copy_grads(source: torch.nn.Module, target: torch.nn.Module) -> None:
    for p, q in zip(source.parameters(), target.parameters(), strict=True):
        q.grad = p.grad.clone()


def assert_same_state(a: torch.nn.Module, opt_a: LARS, b: torch.nn.Module, opt_b: LARS, rtol: float) -> None:
    """Same weights and momentum buffers, to a relative tolerance."""
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=rtol, atol=0)
        buf_p, buf_q = opt_a.state[p]["momentum_buffer"], opt_b.state[q]["momentum_buffer"]
        torch.testing.assert_close(buf_q, buf_p, rtol=rtol, atol=0)


@both_paths
def test_matches_numpy_reference_under_warmup_and_poly_decay(foreach):
    model = small_model()
    opt = lars(model, foreach=foreach)
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


@both_paths
def test_zero_gradient_or_weight_uses_trust_one(foreach):
    w = torch.nn.Parameter(torch.full((4, 4), 0.5, dtype=torch.float64))
    zero = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    opt = LARS([w, zero], lr=0.1, momentum=MOMENTUM, weight_decay=WD, eta=ETA, foreach=foreach)
    w.grad = torch.zeros_like(w)
    zero.grad = torch.ones_like(zero)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full_like(w, 0.5 * (1 - 0.1 * WD)), rtol=0, atol=1e-15)
    torch.testing.assert_close(zero.detach(), torch.full_like(zero, -0.1), rtol=0, atol=1e-15)
    zero.data.zero_()
    zero.grad.zero_()
    opt.step()
    assert torch.isfinite(w).all() and torch.isfinite(zero).all()


@both_paths
def test_skipped_group_gets_no_weight_decay_or_trust(foreach):
    model = small_model()
    opt = lars(model, lr=0.5, foreach=foreach)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["bn_bias"]["weight_decay"] == 0.0 and groups["bn_bias"]["trust"] is False
    assert groups["weights"]["weight_decay"] == WD and groups["weights"]["trust"] is True
    set_grads(model, np.random.default_rng(1))
    before = [p.detach().clone() for p in groups["bn_bias"]["params"]]
    opt.step()
    for p, b in zip(groups["bn_bias"]["params"], before, strict=True):
        torch.testing.assert_close(p.detach(), b - 0.5 * p.grad, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("saved", "loaded"), [(False, False), (True, False), (False, True)])
def test_state_dict_round_trip_continues_identically(saved, loaded):
    model = small_model()
    opt = lars(model, foreach=saved)
    rng = np.random.default_rng(2)
    for _ in range(3):
        set_grads(model, rng)
        opt.step()
    model2 = copy.deepcopy(model)
    opt2 = lars(model2, foreach=loaded)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert all(group["foreach"] is loaded for group in opt2.param_groups)  # the path is not state: it stays
    for _ in range(3):
        set_grads(model, rng)
        copy_grads(model, model2)
        opt.step()
        opt2.step()
    assert_same_state(model, opt, model2, opt2, rtol=0.0 if saved == loaded else 1e-12)  # fp64 parameters


def test_a_state_dict_from_before_the_foreach_option_loads():
    model = small_model()
    opt = lars(model)
    set_grads(model, np.random.default_rng(3))
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    for group in state["param_groups"]:
        del group["foreach"]
    opt2 = lars(copy.deepcopy(model), foreach=False)
    opt2.load_state_dict(state)
    assert all(group["foreach"] is False for group in opt2.param_groups)


def test_foreach_matches_the_per_parameter_path_in_fp32():
    model = small_model().float()
    model2 = copy.deepcopy(model)
    opt, opt2 = lars(model, lr=0.5, foreach=False), lars(model2, lr=0.5, foreach=True)
    rng = np.random.default_rng(4)
    for _ in range(5):
        set_grads(model, rng)
        copy_grads(model, model2)
        opt.step()
        opt2.step()
    assert_same_state(model, opt, model2, opt2, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_16_bit_norms_are_accumulated_in_fp32_and_do_not_overflow(dtype):
    # ||w|| ~ 300 * 256 = 76800 > 65504, fp16's largest value: a norm in fp16 would be inf
    rng = np.random.default_rng(5)
    weights = [torch.from_numpy(rng.normal(300, 10, (256, 256))).to(dtype) for _ in range(2)]
    results = {}
    for foreach in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        for p in params:
            p.grad = p.detach().flip(0)
        LARS(params, lr=10.0, momentum=MOMENTUM, weight_decay=WD, eta=ETA, foreach=foreach).step()
        results[foreach] = params
    for p, q, w in zip(results[False], results[True], weights, strict=True):
        expected, _ = reference_step(w.double().numpy(), 0.0, w.flip(0).double().numpy(), 10.0, skipped=False)
        torch.testing.assert_close(q.detach(), torch.from_numpy(expected).to(dtype))  # dtype's default tolerance
        assert not torch.equal(q, w)
        assert torch.equal(q, p)


@both_paths
def test_a_tensor_lr_updated_in_place_gives_the_float_lr_result(foreach):
    model = small_model().float()
    model2 = copy.deepcopy(model)
    lr = torch.tensor(0.1)
    opt, opt2 = lars(model, lr=0.1, foreach=foreach), lars(model2, lr=lr, foreach=foreach)
    rng = np.random.default_rng(6)
    for value in (0.1, 0.4, 0.25):  # as a CUDA graph would see it: one tensor, refilled before each step
        for group in opt.param_groups:
            group["lr"] = value
        lr.fill_(value)
        set_grads(model, rng)
        copy_grads(model, model2)
        opt.step()
        opt2.step()
    assert_same_state(model, opt, model2, opt2, rtol=1e-6)


def _host_read(*args, **kwargs):
    raise AssertionError("a tensor was read back to the host")


@both_paths
def test_a_step_with_a_tensor_lr_reads_nothing_back_to_the_host(foreach, monkeypatch):
    model = small_model()
    set_grads(model, np.random.default_rng(7))
    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            patch.setattr(torch.Tensor, name, _host_read)
        with pytest.raises(AssertionError, match="host"):
            bool(torch.tensor(1.0))  # the patch does catch a read
        opt = lars(model, lr=torch.tensor(0.1), foreach=foreach)
        for _ in range(2):  # the first step also creates the momentum buffers
            opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


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


def test_foreach_none_takes_the_per_parameter_path_for_cpu_parameters(monkeypatch):
    """As torch's optimizers do: multi-tensor ops pay off on CUDA only (docstring of LARS)."""
    monkeypatch.setattr(LARS, "_step_foreach", lambda *_: pytest.fail("the foreach path ran for CPU parameters"))
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    set_grads(model, np.random.default_rng(0))
    lars(model, foreach=None).step()
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))  # it stepped
