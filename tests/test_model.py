import pytest
import torch
import torchvision
from torchvision.models.resnet import Bottleneck

from models import ResNet50, batchnorm, build_resnet50
from models.loss import smoothed_cross_entropy
from models.resnet import MEAN_RGB, STD_RGB


def small_model(**kwargs) -> ResNet50:
    torch.manual_seed(0)
    return build_resnet50(10, batchnorm(0.1, 1e-5), **kwargs)


def test_state_dict_loads_into_torchvision_resnet50():
    model = small_model()
    reference = torchvision.models.resnet50(num_classes=10)
    reference.load_state_dict(model.state_dict(), strict=True)
    images = torch.randint(0, 256, (2, 64, 64, 3), dtype=torch.uint8)
    model.eval()
    reference.eval()
    normalized = (images.permute(0, 3, 1, 2).float() - torch.tensor(MEAN_RGB).view(1, 3, 1, 1)) / torch.tensor(
        STD_RGB
    ).view(1, 3, 1, 1)
    torch.testing.assert_close(model(images), reference(normalized), rtol=1e-4, atol=1e-4)


def test_mlperf_initialisation():
    model = small_model(zero_init_residual=True)
    assert abs(model.fc.weight.std().item() - 0.01) < 0.002
    assert torch.all(model.fc.bias == 0)
    conv = model.layer3[0].conv2  # 3x3, 256 in: He-normal fan-in std = sqrt(2 / (256 * 9))
    expected = (2 / conv.weight[0].numel()) ** 0.5
    assert abs(conv.weight.std().item() - expected) / expected < 0.05
    blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
    assert len(blocks) == 16
    assert all(torch.all(b.bn3.weight == 0) for b in blocks)
    assert torch.all(model.bn1.weight == 1)


def test_zero_init_residual_is_optional():
    model = small_model(zero_init_residual=False)
    assert torch.all(model.layer1[0].bn3.weight == 1)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uint8_nhwc_input_normalised_inside_the_model(channels_last, dtype):
    """In the model's dtype and memory format, as the first convolution takes it."""
    model = small_model(channels_last=channels_last).to(dtype)
    images = torch.full((1, 8, 8, 3), 0, dtype=torch.uint8)
    images[..., 1] = 255
    x = model.normalize(images)
    assert x.shape == (1, 3, 8, 8) and x.dtype == dtype
    assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    expected = (torch.tensor([0, 255, 0.0]) - torch.tensor(MEAN_RGB)) / torch.tensor(STD_RGB)
    torch.testing.assert_close(x[0, :, 0, 0], expected.to(dtype))


def test_channels_last_gives_the_same_logits():
    images = torch.randint(0, 256, (2, 48, 48, 3), dtype=torch.uint8)
    plain, channels_last = small_model(), small_model(channels_last=True)
    channels_last.load_state_dict(plain.state_dict())
    plain.eval()
    channels_last.eval()
    torch.testing.assert_close(plain(images), channels_last(images), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_first_layer_over_four_channels_computes_what_three_do(channels_last):
    """device.pad_input_channels: the same parameters (torchvision's keys and shapes), logits and gradients."""
    images = torch.randint(0, 256, (2, 48, 48, 3), dtype=torch.uint8)
    three, four = (
        small_model(channels_last=channels_last),
        small_model(channels_last=channels_last, four_channel_input=True),
    )
    assert {k: v.shape for k, v in four.state_dict().items()} == {k: v.shape for k, v in three.state_dict().items()}
    four.load_state_dict(three.state_dict())
    logits = [model(images) for model in (three, four)]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
    for out in logits:
        out.square().mean().backward()
    torch.testing.assert_close(four.conv1.weight.grad, three.conv1.weight.grad, rtol=1e-4, atol=1e-6)


def test_label_smoothed_loss_matches_the_direct_formula():
    torch.manual_seed(1)
    logits, labels, eps = torch.randn(8, 10, dtype=torch.float64), torch.randint(0, 10, (8,)), 0.1
    log_p = torch.log_softmax(logits, dim=1)
    target = torch.full_like(log_p, eps / 10)
    target[torch.arange(8), labels] += 1 - eps
    direct = -(target * log_p).sum(dim=1).mean()
    torch.testing.assert_close(smoothed_cross_entropy(logits, labels, eps), direct)  # float64 stays float64
    assert smoothed_cross_entropy(logits.half(), labels, eps).dtype == torch.float32  # 16-bit logits: fp32 loss
