"""Triton kernels of the course. Import ``helpers`` (done by this package) before defining any kernel:
on a machine without a GPU it switches Triton to its interpreter first."""
from .. import device as _device  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit below)
