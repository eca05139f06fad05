"""What the probe measures of the real model, per pipeline stage: the numbers the memory plan and the cost
model start from. All figures are per replica and per micro-batch unless a name says otherwise."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageProfile:
    first_module: str  # the module name the stage begins at ("conv1" for the first)
    forward_flops: float
    backward_flops: float  # input and weight gradients
    recompute_flops: float  # forward work repeated in backward because of recomputation checkpoints
    memory_bytes: float  # bytes its operations read and write (forward, recomputed forward, backward)
    param_count: int
    activation_bytes: float  # stashed for backward per in-flight micro-batch, checkpoints applied (a tensor
    # saved on both sides of a split counts on both IPUs)
    recompute_peak_bytes: float  # live only while one recomputed segment runs backward (0 without recomputation)
    output_bytes: float  # the activation sent to the next stage (0 for the last)


@dataclass(frozen=True)
class ModelProfile:
    micro_batch: int
    image_size: int
    activation_dtype_bytes: int  # 2 for fp16/bf16 activations, 4 for fp32
    stages: tuple[StageProfile, ...]
    gradient_tensors: int  # parameters that get a gradient (161 for ResNet-50)
    input_bytes: float  # one micro-batch of images as the host sends them (uint8 when 8-bit input)
    matmul_rows: tuple[tuple[int, float], ...] = ()  # each convolution's and matmul's output rows (pixels) per image,
    # with its share of the forward FLOPs: how full a matrix unit's rows are at a batch (the TPU's MXUs)

    @property
    def param_count(self) -> int:
        return sum(stage.param_count for stage in self.stages)
