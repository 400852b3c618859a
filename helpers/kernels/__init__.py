"""Triton kernels of the course. Import ``helpers`` (done by this package) before defining any kernel:
on a machine without a GPU it switches Triton to its interpreter first."""
from .. import device as _device  # sets TRITON_INTERPRET before any @triton.jit below

import inspect as _inspect


def source(kernel) -> str:
    """The Python source of a Triton kernel, whether it is jitted, autotuned or interpreted."""
    fn = kernel
    while not _inspect.isfunction(fn):
        if not hasattr(fn, "fn"):
            raise TypeError(f"{kernel!r} is not a Triton kernel or a function")
        fn = fn.fn
    return _inspect.getsource(fn)


def check_triton_device(device, what: str) -> None:
    """Raise ValueError unless ``device`` can run the Triton kernels here (CUDA, or any device under the
    interpreter); ``what`` names the tensors in the message."""
    if device.type != "cuda" and not _device.INTERPRET:
        raise ValueError(f"{what} is on {device}; the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)")


def check_powers_of_two(config, *names: str) -> None:
    """Raise ValueError naming the first of ``config``'s fields ``names`` that is not a power of two."""
    for name in names:
        value = getattr(config, name)
        if value < 1 or value & (value - 1):
            raise ValueError(f"{type(config).__name__}.{name} must be a power of two, got {value}")


def compiled_variants(kernel) -> list[dict]:
    """Every variant of a jitted kernel compiled in this process: its constexpr values, registers a thread,
    spilled registers and warps, as the loaded binary reports them. Empty in Triton's interpreter."""
    fn = kernel
    while not hasattr(fn, "device_caches") and hasattr(fn, "fn"):
        fn = fn.fn
    if not hasattr(fn, "device_caches") or _device.INTERPRET:
        return []
    names = {i: p.name for i, p in enumerate(fn.params) if p.is_constexpr}
    rows = []
    for cache in fn.device_caches.values():
        for compiled in cache[0].values():
            compiled._init_handles()  # the register count is known once the binary is loaded
            constants = getattr(compiled.src, "constants", {}) or {}
            flags = {names[k[0] if isinstance(k, tuple) else k]: v for k, v in constants.items()
                     if (k[0] if isinstance(k, tuple) else k) in names}
            rows.append({**flags, "registers": compiled.n_regs, "spills": compiled.n_spills,
                         "num_warps": compiled.metadata.num_warps})
    return rows
