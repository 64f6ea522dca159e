"""The backend switch: auto picks the C kernel for fp32 and bf16 CPU tensors and the reference for other CPU
tensors, forcing works, bad names are refused."""

from types import SimpleNamespace

import pytest
import torch

import pagedrl_kernels
import pagedrl_kernels.backend
import pagedrl_kernels.rms_norm


@pytest.mark.usefixtures("triton_installed")
def test_auto_uses_c_then_reference_on_cpu_and_triton_when_forced(monkeypatch):
    calls = []
    monkeypatch.setattr(pagedrl_kernels.rms_norm, "rms_norm_triton", lambda *args: calls.append("triton"))
    monkeypatch.setattr(pagedrl_kernels.rms_norm, "rms_norm_cpu", lambda *args: calls.append("c"))
    monkeypatch.setattr(pagedrl_kernels.rms_norm, "rms_norm_torch", lambda *args: calls.append("torch"))
    x, weight = torch.ones(2, 4), torch.ones(4)
    pagedrl_kernels.rms_norm.rms_norm(x, weight, 1e-6)
    pagedrl_kernels.rms_norm.rms_norm(x.half(), weight.half(), 1e-6)  # the C kernels are fp32 and bf16 only
    with pagedrl_kernels.use_backend("triton"):
        pagedrl_kernels.rms_norm.rms_norm(x, weight, 1e-6)
    with pagedrl_kernels.use_backend("torch"):
        pagedrl_kernels.rms_norm.rms_norm(x, weight, 1e-6)
    assert calls == ["c", "torch", "triton", "torch"]
    assert pagedrl_kernels.get_backend() == "auto"


def test_unknown_backend_is_refused_and_state_kept():
    with pagedrl_kernels.use_backend("torch"):
        with pytest.raises(ValueError, match="unknown kernel backend 'cuda'"):
            pagedrl_kernels.set_backend("cuda")
        assert pagedrl_kernels.get_backend() == "torch"


@pytest.mark.usefixtures("triton_installed")
def test_backend_restored_after_an_error():
    with pytest.raises(RuntimeError), pagedrl_kernels.use_backend("triton"):
        raise RuntimeError("boom")
    assert pagedrl_kernels.get_backend() == "auto"


@pytest.mark.usefixtures("triton_installed")
def test_triton_on_cpu_without_interpreter_explains_the_fix(monkeypatch):
    monkeypatch.setattr(pagedrl_kernels.backend, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        pagedrl_kernels.rms_norm.rms_norm_triton(torch.ones(2, 4), torch.ones(4), 1e-6)


def test_without_triton_auto_runs_the_reference_and_forcing_triton_names_the_fix(monkeypatch):
    monkeypatch.setattr(pagedrl_kernels.backend, "HAS_TRITON", False)
    cuda_tensor = SimpleNamespace(is_cuda=True)  # all use_triton reads; no GPU needed
    assert not pagedrl_kernels.backend.use_triton(cuda_tensor)
    with pytest.raises(RuntimeError, match="triton is not installed"):
        pagedrl_kernels.set_backend("triton")
    assert pagedrl_kernels.get_backend() == "auto"
    with pytest.raises(RuntimeError, match="triton is not installed.*set_backend\\('torch'\\)"):
        pagedrl_kernels.rms_norm.rms_norm_triton(torch.ones(2, 4), torch.ones(4), 1e-6)
