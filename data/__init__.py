"""Datasets (ImageNet folder layout, the embedded synthetic set), samplers, transforms and the loader.

A leaf package: it knows nothing of models or backends.
"""
