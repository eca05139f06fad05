"""ResNet-50 v1.5 (torchvision's) with the MLPerf reference initialisation and uint8 input normalisation."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

# ImageNet channel statistics, in uint8 units, as the MLPerf reference normalises.
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)

NormLayer = Callable[[int], nn.Module]


def random_batch(
    batch: int, image_size: int, classes: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random uint8 NHWC images, the model's input, and labels, drawn on the host (from `generator`, or torch's
    global stream): what the steps run on where no dataset is read (compiling ahead, benchmarks)."""
    images = torch.randint(0, 256, (batch, image_size, image_size, 3), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, classes, (batch,), generator=generator)


class ResNet50(ResNet):
    """torchvision's ResNet-50 v1.5 that takes uint8 NHWC batches and normalises them itself.

    The normalisation's scale and shift are non-persistent buffers, so `state_dict()` holds exactly the keys of
    `torchvision.models.resnet50()` and loads into it.
    """

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(
        self,
        num_classes: int = 1000,
        norm_layer: NormLayer | None = None,
        zero_init_residual: bool = True,
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        super().__init__(Bottleneck, [3, 4, 6, 3], num_classes=num_classes, norm_layer=norm_layer)
        self.memory_format = memory_format
        mean, std = torch.tensor(MEAN_RGB).view(1, 3, 1, 1), torch.tensor(STD_RGB).view(1, 3, 1, 1)
        self.register_buffer("scale", 1 / std, persistent=False)
        self.register_buffer("shift", -mean / std, persistent=False)
        init_mlperf(self, zero_init_residual)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (N, H, W, 3) -> float (N, 3, H, W) in the model's memory format, mean 0 and std 1 per channel.

        `normalized` converts and normalises the pixels; the permuted NHWC batch is already channels-last, so only a
        contiguous model pays a second pass.
        """
        return normalized(images, self.shift, self.scale).contiguous(memory_format=self.memory_format)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(self.normalize(images))


@torch.fx.wrap  # a leaf of symbolic tracing (the simulated IPU's pipeline cut), which cannot follow its branch
def normalized(images: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> `images * scale + shift` as (N, 3, H, W) in the buffers' dtype, channels-last.

    One kernel reads the uint8 pixels and writes the normalised floats (uint8 promotes to the buffers' dtype inside
    it), where converting, subtracting and dividing took three passes. The CPU's kernels convert an input of another
    dtype by a copy first: there that copy is made the output and normalised in place, the same arithmetic with one
    float batch allocated instead of two (bench.trace)."""
    pixels = images.permute(0, 3, 1, 2)
    if pixels.device.type != "cpu":
        return torch.addcmul(shift, pixels, scale)
    floats = pixels.to(scale.dtype)
    return torch.addcmul(shift, floats, scale, out=floats)


class FourChannelConv2d(nn.Conv2d):
    """A convolution of a 3-channel input computed as one of 4 channels, a zero channel added to the input and
    to the weight (whose parameter stays 3-channel, so the state_dict is torchvision's): cuDNN's fp16 kernels for
    a 3-channel first layer are slow, backward most (pytorch#54404), and NVIDIA pads its input to 4 channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (0, 0, 0, 0, 0, 1)  # F.pad's order: last dim first, so this adds one channel after the three
        out: torch.Tensor = self._conv_forward(F.pad(x, pad), F.pad(self.weight, pad), self.bias)
        return out


def init_mlperf(model: ResNet, zero_init_residual: bool) -> None:
    """The MLPerf reference initialisation: He-normal convolutions (fan-in, as Keras' he_normal), fc weights
    normal with std 0.01 and zero bias, BN gamma 1 and beta 0, optionally gamma 0 on each block's last BN."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.01)
            nn.init.zeros_(module.bias)
        elif hasattr(module, "weight") and hasattr(module, "running_mean"):
            nn.init.ones_(module.get_parameter("weight"))
            nn.init.zeros_(module.get_parameter("bias"))
    if zero_init_residual:
        for block in model.modules():
            if isinstance(block, Bottleneck):
                nn.init.zeros_(block.bn3.get_parameter("weight"))


def batchnorm(momentum: float, eps: float) -> NormLayer:
    """The default norm layer: BatchNorm2d with the given momentum (PyTorch convention) and epsilon."""
    return partial(nn.BatchNorm2d, momentum=momentum, eps=eps)


def build_resnet50(
    num_classes: int,
    norm_layer: NormLayer,
    zero_init_residual: bool = True,
    channels_last: bool = False,
    four_channel_input: bool = False,
) -> ResNet50:
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = ResNet50(num_classes, norm_layer, zero_init_residual, memory_format)
    if four_channel_input:
        first = model.conv1
        model.conv1 = FourChannelConv2d(3, first.out_channels, 7, stride=2, padding=3, bias=False)
        model.conv1.weight = first.weight  # the initialised parameter itself
    return model.to(memory_format=memory_format)
