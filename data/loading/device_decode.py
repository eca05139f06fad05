"""Decoding on the training device: a batch's JPEGs decoded there, then cropped, resized and flipped there with
the boxes the fused CPU decoder would use (data.loading.crop_boxes draws them from the headers alone).

torchvision.io.decode_jpeg takes a list of encoded images and a device: on CUDA it decodes the whole list in one
call with nvJPEG, on the GPU's hardware JPEG engines where it has them (A100, H100, H200; pytorch/vision#8496
measured about 7,800 img/s on one A100 from one thread); on the CPU it runs libjpeg-turbo, which is how the tests
compare it with the fused decoder. The crops are then resized as one batch (`resize_crops`): a Python call per
image would cost the training process more than the decode itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.io import ImageReadMode, decode_jpeg

from data.loading.crop_boxes import Box

PADDED_ELEMENTS = 2**26  # the most values a chunk of padded crops holds while resized (256 MB in fp32)


def decode_crops(
    encoded: Sequence[torch.Tensor], boxes: Sequence[Box], flips: Sequence[bool], size: int, device: torch.device
) -> torch.Tensor:
    """The JPEGs in `encoded` (1-D uint8 tensors on the CPU) as a (N, size, size, 3) uint8 batch on `device`:
    each decoded to RGB, cut to its box (top, left, height, width), resized to size x size, flipped if asked.
    Raises RuntimeError where the device's decoder refuses a file (`decode_each` says which)."""
    return resize_crops(decode_all(encoded, device), boxes, flips, size)


def decode_all(encoded: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Each JPEG as a (3, H, W) uint8 image on `device`, decoded in one call.

    On CUDA the decoder writes on a stream of its own into memory the caching allocator hands out on the caller's
    stream, and waits for its stream before it returns (torchvision's decode_jpegs_cuda.cpp): so that no kernel
    still queued on the caller's stream uses that memory, the caller's stream is drained first (pytorch/vision#9606
    saw corrupted batches on an H100 without this)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    images = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)
    return images if isinstance(images, list) else [images]  # a list in gives a list out


def decode_each(encoded: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """`decode_all`, or where the decoder refuses some file of the batch, each file alone: None for each it
    refuses (out of memory is no refusal)."""
    try:
        return list(decode_all(encoded, device))
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:
        return [_decoded_or_none(file, device) for file in encoded]


def _decoded_or_none(file: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    try:
        return decode_all([file], device)[0]
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:
        return None


def resize_crops(
    images: Sequence[torch.Tensor], boxes: Sequence[Box], flips: Sequence[bool], size: int
) -> torch.Tensor:
    """The box of each (3, H, W) uint8 image, resized to size x size as PIL's antialiased bilinear filter does
    (torch's `interpolate(..., antialias=True)` is the same filter) and flipped where asked: (N, size, size, 3)
    uint8.

    The resize is two batched matrix products, out = Wy @ crop @ Wx^T, the filter's weights as matrices (a flip
    reverses Wx's rows), over the crops padded to the largest; chunks bound the padding's memory."""
    device = images[0].device if images else torch.device("cpu")
    out = torch.empty((len(images), size, size, 3), dtype=torch.uint8, device=device)
    for start, stop in _chunks(boxes):
        out[start:stop] = _resized(images[start:stop], boxes[start:stop], flips[start:stop], size)
    return out


def _chunks(boxes: Sequence[Box]) -> list[tuple[int, int]]:
    """(start, stop) of runs of boxes whose crops, padded to the run's largest, hold at most PADDED_ELEMENTS."""
    chunks, start, tallest, widest = [], 0, 0, 0
    for index, (_, _, height, width) in enumerate(boxes):
        tallest, widest = max(tallest, height), max(widest, width)
        if index > start and (index + 1 - start) * 3 * tallest * widest > PADDED_ELEMENTS:
            chunks.append((start, index))
            start, tallest, widest = index, height, width
    if start < len(boxes):
        chunks.append((start, len(boxes)))
    return chunks


def _resized(images: Sequence[torch.Tensor], boxes: Sequence[Box], flips: Sequence[bool], size: int) -> torch.Tensor:
    device = images[0].device
    tallest, widest = max(box[2] for box in boxes), max(box[3] for box in boxes)  # from the host: no device sync
    heights = torch.tensor([box[2] for box in boxes], device=device)
    widths = torch.tensor([box[3] for box in boxes], device=device)
    padded = torch.zeros((len(images), 3, tallest, widest), device=device)
    for slot, (image, (top, left, height, width)) in enumerate(zip(images, boxes, strict=True)):
        padded[slot, :, :height, :width] = image[:, top : top + height, left : left + width]
    rows = filter_weights(heights, size, tallest)
    columns = filter_weights(widths, size, widest)
    flipped = torch.tensor(list(flips), device=device)[:, None, None]
    columns = torch.where(flipped, columns.flip(1), columns)
    resized = rows[:, None] @ padded @ columns[:, None].transpose(-1, -2)
    return resized.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def filter_weights(lengths: torch.Tensor, size: int, padded: int) -> torch.Tensor:
    """(N, size, padded): for each of N inputs of `lengths[n]` pixels resized to `size`, output pixel i's weights
    over the input's pixels (zero past its length), as PIL's antialiased bilinear filter and torch's
    `_upsample_bilinear2d_aa` compute them: a triangle of half-width max(scale, 1) about the output pixel's centre
    in input pixels, cut to the window [int(centre - support + 0.5), int(centre + support + 0.5)), normalised."""
    scale = (lengths.double() / size)[:, None, None]
    support = scale.clamp(min=1.0)
    centre = scale * (torch.arange(size, device=lengths.device, dtype=torch.float64)[None, :, None] + 0.5)
    source = torch.arange(padded, device=lengths.device, dtype=torch.float64)[None, None, :]
    low = (centre - support + 0.5).trunc().clamp(min=0)
    high = torch.minimum((centre + support + 0.5).trunc(), lengths.double()[:, None, None])
    weights = (1 - ((source - centre + 0.5) / support).abs()).clamp(min=0)
    weights = weights * ((source >= low) & (source < high))
    return (weights / weights.sum(-1, keepdim=True)).float()
