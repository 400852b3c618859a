"""Where the host's time goes when the course's norms are called from Python, forward+backward.

    python scripts/host_overhead.py [--calls 200]

For RMSNorm and the fused bias+GELU+LayerNorm on a small shape (the device's time is far below the host's):
the host's time per call (``bench.host_time``) of each layer of the call, from one PyTorch launch and the bare
Triton launches up to ``torch.autograd.grad`` through the autograd Function, beside the device's time (one CUDA
graph); then Python's profiler over the forward+backward calls, the functions that take the most time.

Then, at every shape of the side-by-side run (``helpers.studies.peer_kernels``), the course's forward+backward through
autograd as that run calls it: its host time, its Python-called time (CUDA events around back-to-back calls, no cache
flush) and its device time (a CUDA graph), the shapes taken smallest first and then largest first (a time that
depends on what ran before shows as a difference between the two), the host's time again with the GPU kept busy
(does a launch onto an idle GPU cost more, or does the call wait for the GPU?), and the CUDA API calls the host
makes per call (PyTorch's profiler: kernel launches, and any allocation or synchronisation, which would tie the
host to the device). Last, on a GPU: the forward kernel's launch through the compiled kernel Triton keeps for
it, against the usual ``kernel[grid](...)``. Writes ``results/<gpu>/host_overhead.json`` (on a CPU,
``.smoke-results/``) and prints all of it.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

import helpers  # first: on a machine without a GPU it sets the Triton interpreter up
from helpers import bench, results
from helpers.studies import peer_kernels
from helpers.device import DEVICE, HAS_CUDA, pick
from helpers.kernels import fused_bias_gelu_layernorm as ln
from helpers.kernels import rms_norm as rms


class _Identity(torch.autograd.Function):
    """The autograd Function's own floor: forward and backward that launch nothing."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def _grad(fn, leaves):
    out = fn()
    dy = torch.randn_like(out)
    return lambda: torch.autograd.grad(fn(), leaves, dy)


def layers(m: int, n: int) -> dict[str, callable]:
    """Each layer of a norm's Python call, as a function of no arguments."""
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    b, lb = (torch.randn(n, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    xd, wd, bd, lbd = x.detach(), w.detach(), b.detach(), lb.detach()
    y, rstd = rms.forward(xd, wd)
    dy = torch.randn_like(y)
    cfg = rms.forward_config(n, xd.dtype)
    rows, programs = rms._grid(m, cfg, xd.device)

    def rms_kernel_only():
        rms._rms_norm_fwd_kernel[(programs,)](xd, xd, xd, wd, y, rstd, m, n, n, n, 1e-6, BLOCK_N=cfg.block_n,
                                              ROWS=rows, SINGLE=cfg.block_n >= n, EVEN_N=cfg.block_n == n,
                                              HAS_RES=False, STAGES=cfg.stages, num_warps=cfg.num_warps)
    _, mean, lrstd = ln.forward(xd, bd, wd, lbd)
    return {
        "torch add (one launch)": lambda: xd.add(1.0),
        "identity autograd.Function, grad": _grad(lambda: _Identity.apply(x), [x]),
        "rms_norm: forward kernel launch alone": rms_kernel_only,
        "rms_norm: forward host function": lambda: rms.forward(xd, wd),
        "rms_norm: backward host function": lambda: rms.backward(dy, xd, wd, rstd),
        "rms_norm: backward, unchecked (autograd's)": lambda: rms._backward(dy, xd, wd, rstd, n, None, True),
        "rms_norm: autograd forward": lambda: rms.rms_norm(x, w),
        "rms_norm: autograd forward+backward (grad)": _grad(lambda: rms.rms_norm(x, w), [x, w]),
        "layer_norm: forward host function": lambda: ln.forward(xd, bd, wd, lbd),
        "layer_norm: backward host function": lambda: ln.backward(dy, xd, bd, wd, mean, lrstd),
        "layer_norm: backward, unchecked (autograd's)":
            lambda: ln._backward(dy, xd, bd, wd, mean, lrstd, n, ln._gelu_mode("auto", xd.dtype), None),
        # distinct leaves: a leaf passed twice has autograd add its two gradients, a launch and host time of its own
        "layer_norm: autograd forward+backward (grad)":
            _grad(lambda: ln.fused_bias_gelu_layernorm(x, b, w, lb), [x, b, w, lb]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=pick(full=200, smoke=2))
    args = parser.parse_args()
    print(helpers.describe())
    m, n = pick(full=(4096, 4096), smoke=(6, 40))
    records, calls = [], layers(m, n)
    for name, fn in calls.items():
        host = bench.host_time(fn, calls=args.calls)
        device = bench.time_in_graph([fn], reps=pick(full=20, smoke=1))
        records.append({"what": name, "shape": f"{m} x {n}", "dtype": "bf16", "host_ms": host.ms,
                        "host_ms_p20": host.ms_p20, "host_ms_p80": host.ms_p80,
                        "device_ms": device.ms})
        print(f"{name:48s} host {1e3 * host.ms:8.1f} us   device {1e3 * device.ms:8.1f} us")
    for norm in ("rms_norm", "layer_norm"):
        fn = calls[f"{norm}: autograd forward+backward (grad)"]  # warmed up by its timing above
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(f"\n{norm}, forward+backward, {args.calls} calls: Python's profiler, most time first")
        print(text.getvalue())
        records.append({"what": f"{norm}: profile of forward+backward", "calls": args.calls,
                        "profile": text.getvalue()})
    records += shape_sweep(args.calls)
    print(f"-> {results.save('host_overhead', records)}")
    if HAS_CUDA:  # last, and saved again: a launch this script assembles by hand must not cost the rest
        records.append(compiled_launch(*pick(full=(4096, 4096), smoke=(6, 40)), args.calls))
        print(f"-> {results.save('host_overhead', records)}")


def compiled_launch(m: int, n: int, calls: int) -> dict:
    """RMSNorm's forward kernel launched through the compiled kernel Triton keeps for it (``CompiledKernel``'s own
    launcher, arguments bound once) against ``kernel[grid](...)``, which binds and checks every argument, looks the
    compiled kernel up and checks the kernel's globals on each call: what a leaner launch path could save. Its output
    is compared with the usual launch's before it is timed."""
    x = torch.randn(m, n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
    cfg = rms.forward_config(n, x.dtype)
    rows, programs = rms._grid(m, cfg, x.device)
    outputs = [(torch.empty_like(x), torch.empty(m, device=DEVICE)) for _ in range(2)]
    constants = dict(BLOCK_N=cfg.block_n, ROWS=rows, SINGLE=cfg.block_n >= n, EVEN_N=cfg.block_n == n, HAS_RES=False,
                     STAGES=cfg.stages)
    kernel = rms._rms_norm_fwd_kernel

    def arguments(y, rstd):
        return (x, x, x, w, y, rstd, m, n, n, n, 1e-6)

    def usual(y=outputs[0][0], rstd=outputs[0][1]):
        kernel[(programs,)](*arguments(y, rstd), num_warps=cfg.num_warps, **constants)

    compiled = kernel.warmup(*arguments(*outputs[1]), grid=(programs,), num_warps=cfg.num_warps, **constants)
    bound = (*arguments(*outputs[1]), *(constants[name] for name in kernel.arg_names[11:]))
    launch = compiled[(programs, 1, 1)]
    usual()
    launch(*bound)
    same = bool(torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1]))
    record = {"what": "rms_norm: forward kernel, launched through its compiled kernel", "shape": f"{m} x {n}",
              "dtype": "bf16", "same_output": same}
    if same:
        plain, direct = bench.host_time(usual, calls=calls), bench.host_time(lambda: launch(*bound), calls=calls)
        record.update(host_ms=direct.ms, host_ms_p20=direct.ms_p20, host_ms_p80=direct.ms_p80, usual_host_ms=plain.ms)
        print(f"RMSNorm forward kernel: kernel[grid](...) {1e3 * plain.ms:.1f} us of host time a launch, through the "
              f"compiled kernel {1e3 * direct.ms:.1f} us")
    else:
        print("the compiled kernel's launch gave another output: not timed")
    return record


def api_calls(fn, calls: int) -> dict[str, list[float]]:
    """The CUDA runtime and driver calls ``calls`` calls of ``fn`` make, per call: {name: [count, microseconds]}."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if HAS_CUDA else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if HAS_CUDA:
            torch.cuda.synchronize()
    return {e.key: [e.count / calls, e.cpu_time_total / calls] for e in prof.key_averages()
            if e.key.startswith("cu") and e.key != "cudaDeviceSynchronize"}


def shape_sweep(calls: int) -> list[dict]:
    """The course's norms, forward+backward through autograd, at the side-by-side run's shapes, in both orders."""
    cases = peer_kernels.rms_norm_cases() + peer_kernels.layer_norm_cases()
    records = []
    for order, sequence in (("smallest first", sorted(cases, key=lambda c: c.leaves[0].numel())),
                            ("largest first", sorted(cases, key=lambda c: -c.leaves[0].numel()))):
        print(f"\nforward+backward through autograd, the side-by-side run's shapes, {order}:")
        for case in sequence:
            fn = peer_kernels.runner(case, "course", "fwd+bwd")
            host = bench.host_time(fn, calls=max(1, calls // 4))
            python = bench.time_fn(fn, flush_l2=False, **pick(full={}, smoke={"warmup_ms": 0, "rep_ms": 1}))
            device = bench.time_in_graph([fn] * pick(full=5, smoke=1), reps=pick(full=20, smoke=1))
            busy = bench.host_time(fn, calls=max(1, calls // 4), busy_gpu=True) if HAS_CUDA else None
            api = api_calls(fn, pick(full=20, smoke=1))
            launches = sum(v[0] for k, v in api.items() if "Launch" in k)
            others = ", ".join(f"{k} x{v[0]:.2f} ({v[1]:.1f} us)" for k, v in api.items() if "Launch" not in k)
            records.append({"what": f"{case.kernel}: autograd forward+backward, side-by-side shape", "order": order,
                            "shape": case.shape, "dtype": case.dtype, "host_ms": host.ms, "host_ms_p20": host.ms_p20,
                            "host_ms_p80": host.ms_p80, "host_ms_gpu_busy": busy.ms if busy else None,
                            "gpu_busy_throughout": busy.timer == "host, GPU busy" if busy else None,
                            "python_ms": python.ms, "device_ms": device.ms,
                            "launches_per_call": launches, "other_cuda_calls_per_call": others or "none"})
            behind = "" if busy is None else f" ({1e3 * busy.ms:.1f} us timed as {busy.timer})"
            print(f"  {case.kernel:10s} {case.shape:26s} {case.dtype}: host {1e3 * host.ms:7.1f} us{behind}, "
                  f"called from Python {1e3 * python.ms:7.1f} us, device {1e3 * device.ms:7.1f} us; per call "
                  f"{launches:.1f} launches, other CUDA calls: {others or 'none'}")
    return records


if __name__ == "__main__":
    main()
