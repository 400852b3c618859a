"""Triton kernels of the course. Import ``helpers`` (done by this package) before defining any kernel:
on a machine without a GPU it switches Triton to its interpreter first."""
from .. import device as _device  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit below)

import inspect as _inspect


def source(kernel) -> str:
    """The Python source of a Triton kernel, whether it is jitted, autotuned or interpreted."""
    fn = kernel
    while not _inspect.isfunction(fn):
        if not hasattr(fn, "fn"):
            raise TypeError(f"{kernel!r} is not a Triton kernel or a function")
        fn = fn.fn
    return _inspect.getsource(fn)
