"""data.decode=gpu's decoder: a batch's JPEGs decoded on the training device, then cropped, resized and flipped
there with the boxes the fused CPU decoder would use (data.transforms draws them from the headers alone).

torchvision.io.decode_jpeg takes a list of encoded images and a device: on CUDA it decodes the batch with nvJPEG
(pytorch/vision#8496 measured over 8,000 img/s on one A100); on the CPU it runs libjpeg-turbo, which is how the
tests compare it with the fused decoder. The resize is torch's antialiased bilinear, which follows PIL's filter
as the fused decoder does, so the two give close pixels (not equal: the fused decoder also decodes at a reduced
DCT scale where the crop allows, and the IDCTs differ).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, decode_jpeg

from data.transforms import Box


def decode_crops(
    encoded: Sequence[torch.Tensor], boxes: Sequence[Box], flips: Sequence[bool], size: int, device: torch.device
) -> torch.Tensor:
    """The JPEGs in `encoded` (1-D uint8 tensors on the CPU) as a (N, size, size, 3) uint8 batch on `device`:
    each decoded to RGB, cut to its box (top, left, height, width), resized to size x size, flipped if asked."""
    images = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)
    batch = torch.empty((len(images), size, size, 3), dtype=torch.uint8, device=device)
    for slot, (image, (top, left, height, width), flip) in enumerate(zip(images, boxes, flips, strict=True)):
        crop = image[None, :, top : top + height, left : left + width].float()
        resized = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        if flip:
            resized = resized.flip(-1)
        batch[slot] = resized[0].round_().clamp_(0, 255).permute(1, 2, 0)
    return batch
