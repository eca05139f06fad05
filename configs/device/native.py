"""The native device's section: the host's CPU or one CUDA GPU per process (configs/device/cpu.yaml, cuda.yaml),
and the speed options of PyTorch eager on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from configs.checks import require
from configs.device.base import DeviceConfig
from configs.shape import BatchShape


@dataclass
class NativeConfig(DeviceConfig):
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    channels_last: bool = True  # NHWC activations: the step 1.36x on an H200 (docs/gpu.md); not measured on a CPU
    foreach: bool | None = None  # the optimizer step as multi-tensor ops over all parameters; None: on CUDA only
    # native 16-bit compute: BatchNorm takes the 16-bit activations as they are (statistics and weights in fp32
    # inside its kernel) instead of a copy cast to fp32 first; None: on CUDA only
    bn_16bit_input: bool | None = None
    compile: bool = False  # torch.compile the model (its forward and backward; the first steps compile)
    pad_input_channels: bool = False  # the first convolution over 4 channels, a zero one added (cuDNN's fp16)
    cuda_graphs: bool = False  # the train step captured once in a CUDA graph and replayed (where it can be)

    schema: ClassVar[str] = "native"
    needs: ClassVar[str] = "device=cpu or device=cuda"

    def validate(self, bn_group_size: int, shape: BatchShape) -> None:
        require(self.threads >= 0, "device.threads", f"must be 0 (default) or more, got {self.threads}")
