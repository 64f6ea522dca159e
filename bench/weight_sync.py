"""LoRA weight-sync time per push against the machine's copy bandwidth.

    python bench/weight_sync.py [--repeats 20] [--bucket-mb 64]

SmolLM2-135M shapes (30 layers, hidden 576, intermediate 1536, 9 heads, 3 KV heads, head_dim 64), r=16 on
all seven projections, fp32: in-process and over gloo between two processes. With CUDA: a 7B-shaped adapter
(32 layers, hidden 4096, intermediate 11008, 32 heads of 128) in-process on the GPU, and over NCCL when a
second GPU exists. The baseline is one flat tensor copy of the same number of bytes on the same device.
Targets: in-process >= 50% of copy bandwidth; gloo < 100 ms for the 135M adapter; NCCL < 10 ms for 7B.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rl.job.rollout_worker import DistributedSync
from rl.sync.transport import InProcessSync, TensorSpec

SMOLLM2_135M = dict(num_layers=30, hidden=576, intermediate=1536, num_heads=9, num_kv_heads=3, head_dim=64)
LLAMA_7B = dict(num_layers=32, hidden=4096, intermediate=11008, num_heads=32, num_kv_heads=32, head_dim=128)


def adapter_specs(
    num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim, rank=16, dtype=torch.float32
):
    """Engine names and shapes of a LoRA adapter on q, k, v, o, gate, up and down of a llama-style model."""
    in_out = {
        "self_attn.q_proj": (hidden, num_heads * head_dim),
        "self_attn.k_proj": (hidden, num_kv_heads * head_dim),
        "self_attn.v_proj": (hidden, num_kv_heads * head_dim),
        "self_attn.o_proj": (num_heads * head_dim, hidden),
        "mlp.gate_proj": (hidden, intermediate),
        "mlp.up_proj": (hidden, intermediate),
        "mlp.down_proj": (intermediate, hidden),
    }
    specs = {}
    for layer in range(num_layers):
        for module, (in_features, out_features) in in_out.items():
            specs[f"model.layers.{layer}.{module}.lora_A"] = TensorSpec((rank, in_features), dtype)
            specs[f"model.layers.{layer}.{module}.lora_B"] = TensorSpec((out_features, rank), dtype)
    return specs


class BufferReceiver:
    """Engine stand-in: zero-filled LoRA buffers on one device."""

    def __init__(self, specs: dict[str, TensorSpec], device: str = "cpu"):
        self.buffers = {n: torch.zeros(s.shape, dtype=s.dtype, device=device) for n, s in specs.items()}
        self.version = -1

    def lora_buffers(self) -> dict[str, torch.Tensor]:
        return self.buffers

    def set_lora_version(self, version: int) -> None:
        self.version = version

    def handle(self, request):
        return self.version


def _median_ms(fn, repeats: int, device: str) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def copy_bandwidth_ms(num_bytes: int, device: str, repeats: int) -> float:
    """Median ms of one flat copy of ``num_bytes`` on ``device``: the baseline."""
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src), repeats, device)


def random_tensors(specs: dict[str, TensorSpec], device: str) -> dict[str, torch.Tensor]:
    return {n: torch.randn(s.shape, device=device).to(s.dtype) for n, s in specs.items()}


def bench_push(sync, named, repeats: int) -> tuple[float, int]:
    """Median ms per push (after one warm-up push) and the bytes per push."""
    stats = [sync.push(named, version) for version in range(repeats + 1)][1:]
    return statistics.median(s.ms for s in stats), stats[0].bytes


def row(name, device, ms, num_bytes, copy_ms, min_ratio=None, max_ms=None) -> dict:
    """Print one result line against its target (a share of copy bandwidth, or a time) and return it."""
    gbps, copy_gbps = num_bytes / ms / 1e6, num_bytes / copy_ms / 1e6
    ratio = gbps / copy_gbps
    met = ratio >= min_ratio if min_ratio is not None else ms < max_ms
    target = f">= {min_ratio:.2f} ratio" if min_ratio is not None else f"< {max_ms:g} ms"
    print(
        f"{name:<22} {device:<8} {num_bytes / 2**20:>9.1f} {ms:>9.3f} {gbps:>8.2f} {copy_gbps:>9.2f} "
        f"{ratio:>6.2f}  {target} {'met' if met else 'MISSED'}"
    )
    return dict(name=name, device=device, bytes=num_bytes, ms=ms, gbps=gbps, copy_gbps=copy_gbps, met=met)


def run_inprocess(name, specs, device, repeats) -> dict:
    named = random_tensors(specs, device)
    ms, num_bytes = bench_push(InProcessSync(BufferReceiver(specs, device)), named, repeats)
    return row(name, device, ms, num_bytes, copy_bandwidth_ms(num_bytes, device, repeats), min_ratio=0.5)


def run_distributed(name, specs, device, worker_device, bucket_bytes, repeats, max_ms) -> dict:
    named = random_tensors(specs, device)
    with DistributedSync(BufferReceiver, (specs, worker_device), bucket_bytes=bucket_bytes) as sync:
        ms, num_bytes = bench_push(sync, named, repeats)
        label = f"{name} ({sync.backend})"
    copy_ms = copy_bandwidth_ms(num_bytes, device, repeats)
    return row(label, device, ms, num_bytes, copy_ms, max_ms=max_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args()
    bucket_bytes = int(args.bucket_mb * 2**20)
    small = adapter_specs(**SMOLLM2_135M)
    print(
        f"{'sync':<22} {'device':<8} {'MiB':>9} {'ms':>9} {'GB/s':>8} {'copy GB/s':>9} {'ratio':>6}  target"
    )
    rows = [
        run_inprocess("135M r16 in-process", small, "cpu", args.repeats),
        run_distributed("135M r16", small, "cpu", "cpu", bucket_bytes, args.repeats, max_ms=100),
    ]
    if torch.cuda.is_available():
        large = adapter_specs(**LLAMA_7B)
        rows.append(run_inprocess("7B r16 in-process", large, "cuda", args.repeats))
        if torch.cuda.device_count() >= 2:
            rows.append(
                run_distributed("7B r16", large, "cuda:0", "cuda:1", bucket_bytes, args.repeats, max_ms=10)
            )
        else:
            print("7B r16 over NCCL: skipped, NCCL needs a second GPU for the worker")
    print(json.dumps({"bench": "weight_sync", "results": rows}))


if __name__ == "__main__":
    main()
