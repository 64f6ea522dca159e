"""Paged decode attention microbenchmark.

Times the paged decode attention the engine runs on the device (the Triton kernel on CUDA, the PyTorch
reference on CPU) and, side by side, dense SDPA over the same K/V stored contiguously (no paging). Reports the
achieved K/V read bandwidth as a fraction of the measured device-to-device copy bandwidth.

    python bench/paged_attention.py        # CUDA: context 512, 4k, 32k x batch 1, 16, 128; Qwen3-1.7B heads
    python bench/paged_attention.py --cpu  # smoke run on the CPU with small shapes
    TRITON_INTERPRET=1 python bench/paged_attention.py --cpu --backend triton --context-lens 128 \\
        --batch-sizes 2                    # the Triton path under the interpreter (slow; correctness only)

Small batches at short contexts are bound by the launch overhead (eager launches, no CUDA graph).
Prints a table and a final JSON line; writes $OUT/paged_attention.json when OUT is set.
"""

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from json_line import emit

from pagedrl_kernels import use_backend  # noqa: E402
from pagedrl_kernels.paged_attention import paged_attention_decode  # noqa: E402


@dataclass(slots=True)
class Case:
    context_len: int
    batch: int
    paged_ms: float
    dense_sdpa_ms: float
    kv_bytes: int
    paged_gbps: float
    fraction_of_copy: float
    speedup_vs_dense: float
    max_abs_diff: float  # paged output against the dense SDPA output


def timed(fn, device: torch.device, min_seconds: float) -> float:
    """Milliseconds per call: a warm-up, then enough calls to fill min_seconds."""
    fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - start, 1e-6)
    iters = max(3, min(500, int(min_seconds / once)))
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e3


def copy_bandwidth_gbps(device: torch.device, nbytes: int, min_seconds: float) -> float:
    """Device-to-device copy bandwidth counting the bytes read plus the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), device, min_seconds)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def time_paged(q, k_cache, v_cache, tables, context_lens, device, min_seconds):
    scale = q.shape[-1] ** -0.5
    run = lambda: paged_attention_decode(q, k_cache, v_cache, tables, context_lens, scale)
    return timed(run, device, min_seconds), run()


def time_dense_sdpa(q, k_cache, v_cache, tables, device, min_seconds):
    """SDPA over the same K/V laid out contiguously per sequence; the query heads of a KV head
    act as its query rows."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    dense = lambda cache: cache[tables.long()].flatten(1, 2).transpose(1, 2).contiguous()  # [b, kv, len, dim]
    k, v = dense(k_cache), dense(v_cache)
    q_rows = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    run = lambda: F.scaled_dot_product_attention(q_rows, k, v, scale=head_dim**-0.5)
    return timed(run, device, min_seconds), run().reshape(batch, num_heads, head_dim)


def run_case(context_len, batch, args, device, dtype, copy_gbps) -> Case:
    num_blocks_per_seq = context_len // args.block_size
    num_blocks = batch * num_blocks_per_seq
    shape = (num_blocks, args.block_size, args.num_kv_heads, args.head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    # Sequences own scattered pages, as after the block pool has churned.
    tables = torch.randperm(num_blocks, device=device).view(batch, num_blocks_per_seq).int()
    context_lens = torch.full((batch,), context_len, dtype=torch.int32, device=device)
    q = torch.randn(batch, args.num_heads, args.head_dim, dtype=dtype, device=device)
    paged_ms, paged_out = time_paged(q, k_cache, v_cache, tables, context_lens, device, args.min_seconds)
    dense_ms, dense_out = time_dense_sdpa(q, k_cache, v_cache, tables, device, args.min_seconds)
    kv_bytes = 2 * batch * context_len * args.num_kv_heads * args.head_dim * dtype.itemsize
    gbps = kv_bytes / (paged_ms * 1e-3) / 1e9
    max_abs_diff = (paged_out.float() - dense_out.float()).abs().max().item()
    return Case(
        context_len,
        batch,
        paged_ms,
        dense_ms,
        kv_bytes,
        gbps,
        gbps / copy_gbps,
        dense_ms / paged_ms,
        max_abs_diff,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu", action="store_true", help="small smoke run of the CPU path")
    parser.add_argument("--context-lens", type=int, nargs="+")
    parser.add_argument("--batch-sizes", type=int, nargs="+")
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--backend", choices=["auto", "torch", "triton"], default="auto", help="kernel backend"
    )
    parser.add_argument("--min-seconds", type=float, default=0.2, help="timing window per measurement")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: pass --cpu for the CPU smoke run")
    args.context_lens = args.context_lens or ([512, 2048] if args.cpu else [512, 4096, 32768])
    args.batch_sizes = args.batch_sizes or ([1, 4] if args.cpu else [1, 16, 128])
    if any(n % args.block_size for n in args.context_lens):
        parser.error(f"context lengths must be multiples of the block size {args.block_size}")
    args.dtype = args.dtype or ("float32" if args.cpu else "bfloat16")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = getattr(torch, args.dtype)
    copy_gbps = copy_bandwidth_gbps(device, (256 if args.cpu else 2048) * 2**20, args.min_seconds)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"device {device} ({name}), {args.dtype}, "
        f"heads {args.num_heads}/{args.num_kv_heads} x {args.head_dim}, block {args.block_size}"
    )
    print(f"measured copy bandwidth: {copy_gbps:.1f} GB/s (read + write)")
    print(
        f"{'context':>8} {'batch':>6} {'paged ms':>10} {'dense ms':>10} {'GB/s':>9} {'of copy':>8} "
        f"{'vs dense':>9} {'max diff':>9}"
    )
    cases = []
    for context_len in args.context_lens:
        for batch in args.batch_sizes:
            with use_backend(args.backend):
                case = run_case(context_len, batch, args, device, dtype, copy_gbps)
            cases.append(case)
            print(
                f"{case.context_len:>8} {case.batch:>6} {case.paged_ms:>10.4f} {case.dense_sdpa_ms:>10.4f} "
                f"{case.paged_gbps:>9.1f} {case.fraction_of_copy:>8.1%} {case.speedup_vs_dense:>8.2f}x "
                f"{case.max_abs_diff:>9.2e}"
            )
    result = {
        "bench": "paged_attention",
        "device": str(device),
        "dtype": args.dtype,
        "backend": args.backend,
        "copy_gbps": copy_gbps,
        # The target: at 4k context and batch >= 16, at least 60% of the copy bandwidth.
        "min_fraction_of_copy_4k_batch16plus": min(
            (case.fraction_of_copy for case in cases if case.context_len == 4096 and case.batch >= 16),
            default=None,
        ),
        "cases": [asdict(case) for case in cases],
    }
    emit("paged_attention", result)


if __name__ == "__main__":
    main()
