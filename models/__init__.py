"""ResNet-50 v1.5 for MLPerf: torchvision's network, the reference initialisation, uint8 input, the loss."""

from models.resnet import ResNet50, batchnorm, build_resnet50, init_mlperf, random_batch

__all__ = ["ResNet50", "batchnorm", "build_resnet50", "init_mlperf", "random_batch"]
