import os
import subprocess
import sys
import textwrap

import pytest

from helpers import device


def test_pick_follows_scale(monkeypatch):
    monkeypatch.setattr(device, "SCALE", "full")
    assert device.pick(full=1, smoke=2) == 1
    monkeypatch.setattr(device, "SCALE", "smoke")
    assert device.pick(full=1, smoke=2) == 2


@pytest.mark.parametrize("value,expected", [("full", "full"), ("SMOKE", "smoke"), (" smoke ", "smoke")])
def test_scale_env_override(monkeypatch, value, expected):
    monkeypatch.setenv("COURSE_SCALE", value)
    assert device._scale_from_env() == expected


def test_scale_default_follows_cuda(monkeypatch):
    monkeypatch.delenv("COURSE_SCALE", raising=False)
    assert device._scale_from_env() == ("full" if device.HAS_CUDA else "smoke")


def test_bad_scale_is_refused(monkeypatch):
    monkeypatch.setenv("COURSE_SCALE", "medium")
    with pytest.raises(ValueError, match="COURSE_SCALE"):
        device._scale_from_env()


@pytest.mark.skipif(device.HAS_CUDA, reason="the message of a machine without a GPU")
def test_require_cuda_message():
    with pytest.raises(RuntimeError, match="the QLoRA sweep needs a CUDA GPU"):
        device.require_cuda("the QLoRA sweep")


@pytest.mark.gpu
def test_require_cuda_passes_on_a_gpu():
    device.require_cuda("this")


@pytest.mark.skipif(device.HAS_CUDA, reason="the interpreter switch is for machines without a GPU")
def test_importing_helpers_makes_triton_kernels_run_on_cpu():
    """Importing helpers before defining a kernel is enough: the kernel runs in Triton's interpreter."""
    code = textwrap.dedent("""
        import helpers, torch, triton, triton.language as tl

        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

        x = torch.arange(100, dtype=torch.float32)
        add_one[(triton.cdiv(100, 32),)](x, 100, BLOCK=32)
        assert torch.equal(x, torch.arange(100, dtype=torch.float32) + 1), x
        print("interpreted", helpers.INTERPRET)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "interpreted True" in out.stdout


def test_describe_mentions_scale():
    assert f"scale={device.SCALE}" in device.describe()
