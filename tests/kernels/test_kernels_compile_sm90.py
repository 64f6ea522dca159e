"""The Triton kernels compile for the H200 (sm_90) down to a cubin through ptxas, without register spills.

No GPU is needed: a subprocess (this module run as a script, with the interpreter off) compiles each kernel
ahead of time for the sm_90 target, with the 16-divisibility that launches on real tensors get, and reads
the register and stack use of the cubin."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FLOAT_ARGS = {"scale", "eps"}
TORCH_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
# Integer arguments a real launch sees as multiples of 16 (head dims 64/128), so triton specialises them.
DIVISIBLE_BY_16 = {
    "head_dim",
    "split_len",
    "stride_q_seq",
    "stride_q_head",
    "stride_q_token",
    "stride_out_token",
    "stride_out_head",
    "stride_cache_block",
    "stride_cache_token",
    "stride_cache_head",
    "stride_po_seq",
    "stride_po_head",
    "stride_po_split",
    "in_features",
    "out_features",
    "stride_x",
    "stride_a",
    "stride_b",
    "stride_y",
}


def kernel_specs(dtype: str, head_dim: int, group: int) -> list:
    """(name, kernel, pointer types, constexprs, launch options) as the launchers would pass them."""
    import torch

    from pagedrl_kernels import (
        activation,
        lora_triton,
        paged_decode,
        paged_prefill,
        reshape_and_cache,
        rms_norm,
        rotary_embedding,
    )

    act = "*" + dtype
    precision = "ieee" if dtype == "fp32" else "tf32"
    block_q, block_g, block_n = paged_prefill.prefill_tiles(getattr(torch, TORCH_DTYPES[dtype]), group)
    attention = {"q_ptr": act, "k_cache_ptr": act, "v_cache_ptr": act, "block_tables_ptr": "*i32"}
    return [
        (
            "decode_split",
            paged_decode._decode_split_kernel,
            {**attention, "context_lens_ptr": "*i32", "partial_out_ptr": "*fp32", "partial_lse_ptr": "*fp32"},
            {
                "BLOCK_SIZE": 16,
                "BLOCK_N": paged_decode.BLOCK_N,
                "BLOCK_G": 16,
                "BLOCK_D": head_dim,
                "DOT_PRECISION": precision,
            },
            {"num_warps": 4, "num_stages": 3},
        ),
        (
            "decode_merge",
            paged_decode._decode_merge_kernel,
            {
                "partial_out_ptr": "*fp32",
                "partial_lse_ptr": "*fp32",
                "context_lens_ptr": "*i32",
                "out_ptr": act,
            },
            {"BLOCK_S": paged_decode.MAX_SPLITS, "BLOCK_D": head_dim},
            {},
        ),
        (
            "prefill",
            paged_prefill._prefill_kernel,
            {**attention, "cu_seqlens_q_ptr": "*i32", "context_lens_ptr": "*i32", "out_ptr": act},
            {
                "BLOCK_SIZE": 16,
                "BLOCK_Q": block_q,
                "BLOCK_G": block_g,
                "BLOCK_N": block_n,
                "BLOCK_D": head_dim,
                "DOT_PRECISION": precision,
            },
            {"num_warps": 4, "num_stages": 2},
        ),
        (
            "reshape_and_cache",
            reshape_and_cache._reshape_and_cache_kernel,
            {
                "key_ptr": act,
                "value_ptr": act,
                "k_cache_ptr": act,
                "v_cache_ptr": act,
                "slot_mapping_ptr": "*i64",
            },
            {"BLOCK_H": 8, "BLOCK_D": head_dim},
            {},
        ),
        (
            "rms_norm",
            rms_norm._rms_norm_kernel,
            {"x_ptr": act, "residual_ptr": act, "weight_ptr": act, "out_ptr": act, "hidden_ptr": act},
            {"HAS_RESIDUAL": True, "BLOCK": 2048},
            {"num_warps": 8},
        ),
        (
            "rotary",
            rotary_embedding._rotary_kernel,
            {"positions_ptr": "*i64", "q_ptr": act, "k_ptr": act, "cache_ptr": "*fp32"},
            {"BLOCK_H": 16, "BLOCK_KV_H": 8, "BLOCK_HALF": head_dim // 2},
            {},
        ),
        (
            "silu_and_mul",
            activation._silu_and_mul_kernel,
            {"gate_ptr": act, "up_ptr": act, "out_ptr": act},
            {"BLOCK": 1024},
            {},
        ),
        (
            "lora_shrink",
            lora_triton._lora_shrink_kernel,
            {"x_ptr": act, "a_ptr": act, "h_ptr": "*fp32"},
            {
                "SPLIT": True,
                "BLOCK_T": 16,
                "BLOCK_R": 16,
                "BLOCK_K": 128 if dtype == "bf16" else 64,
                "DOT_PRECISION": precision,
            },
            {},
        ),
        (
            "lora_reduce",
            lora_triton._lora_reduce_kernel,
            {"partial_ptr": "*fp32", "h_ptr": act},
            {"BLOCK_T": 16, "BLOCK_R": 16},
            {},
        ),
        (
            "lora_expand",
            lora_triton._lora_expand_kernel,
            {"h_ptr": act, "b_ptr": act, "y_ptr": act, "mask_ptr": act},
            {
                "HAS_MASK": True,
                "BLOCK_T": 64,
                "BLOCK_N": 128 if dtype == "bf16" else 64,
                "BLOCK_R": 64,
                "DOT_PRECISION": precision,
            },
            {"num_warps": lora_triton.expand_num_warps(getattr(torch, TORCH_DTYPES[dtype]))},
        ),
    ]


def resource_usage(cubin: bytes) -> dict[str, int]:
    import tempfile

    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    fields = dict(field.split(":") for field in line.split() if ":" in field)
    return {"registers": int(fields["REG"]), "stack_bytes": int(fields["STACK"])}


def compile_all(dtype: str) -> dict[str, dict[str, int]]:
    """Compile every kernel for sm_90 at the SmolLM2 (head dim 64, group 3) and Qwen3-1.7B (128, 2) shapes."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report = {}
    for head_dim, group in ((64, 3), (128, 2)):
        for name, kernel, pointers, constexprs, options in kernel_specs(dtype, head_dim, group):
            names = list(inspect.signature(kernel.fn).parameters)
            signature = {
                n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n in FLOAT_ARGS else "i32")
                for n in names
            }
            aligned = [n for n in names if n in pointers or n in DIVISIBLE_BY_16]
            source = ASTSource(
                fn=kernel,
                signature=signature,
                constexprs={(names.index(n),): value for n, value in constexprs.items()},
                attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
            )
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            report[f"{name}[d{head_dim}]"] = resource_usage(compiled.asm["cubin"])
    return report


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.usefixtures("triton_installed")
def test_kernels_compile_for_sm90_without_spills(dtype):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run(
        [sys.executable, "-m", __name__, dtype],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert len(report) == 20
    spilled = {name: usage for name, usage in report.items() if usage["stack_bytes"]}
    assert not spilled, f"register spills on sm_90: {spilled}"


if __name__ == "__main__":
    print(json.dumps(compile_all(sys.argv[1])))
