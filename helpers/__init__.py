"""Kernels and measurement code for the GPU performance course.

``helpers.device`` is imported first: without a GPU it switches Triton to its interpreter before
any kernel is defined.
"""
from .device import DEVICE, HAS_CUDA, INTERPRET, SCALE, describe, gpu_name, pick, require_cuda

__all__ = ["DEVICE", "HAS_CUDA", "INTERPRET", "SCALE", "describe", "gpu_name", "pick", "require_cuda"]
