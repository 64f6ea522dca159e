"""LoRA shrink/expand microbenchmark: the Triton kernels against the PyTorch reference, side by side.

For every projection shape of SmolLM2-135M and Qwen3-1.7B (q, k/v, o, gate/up, down) and token counts 1, 8, 64
and 256, times `y += scale * (x A^T) B^T` (mask optional) both ways: the reference (x A^T, the scale, h B^T,
the mask multiply and the add: four or five launches and a [num_tokens, out] temporary) and the Triton path
(two launches, three when shrink splits its input features; the delta added in place). Each is timed
eagerly and replayed from a CUDA graph, as decode will be.

    python bench/lora.py                     # CUDA: bf16, rank 16
    python bench/lora.py --rank 64 --mixed   # a larger adapter; a 0/1 per-token mask (mixed batch)
    python bench/lora.py                     # without CUDA: the reference only, in fp32, and says so

Prints a table and a final JSON line; writes $OUT/lora.json when OUT is set.
"""

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from json_line import emit
from paged_attention import timed  # noqa: E402

from pagedrl_kernels import use_backend  # noqa: E402
from pagedrl_kernels.lora import lora_expand, lora_shrink  # noqa: E402

# (hidden, intermediate, attention width, key/value width) of the two models.
MODELS = {"smollm2_135m": (576, 1536, 576, 192), "qwen3_1.7b": (2048, 6144, 2048, 1024)}


@dataclass(slots=True)
class Case:
    model: str
    projections: str  # the projections of one layer sharing this shape, e.g. "gate,up"
    in_features: int
    out_features: int
    num_tokens: int
    torch_ms: float
    triton_ms: float | None
    torch_graph_ms: float | None
    triton_graph_ms: float | None
    speedup: float | None
    graph_speedup: float | None
    max_abs_diff: float | None  # Triton output against the reference output


def projection_shapes(model: str) -> dict[tuple[int, int], list[str]]:
    """(in, out) -> the names of one layer's projections with that shape."""
    hidden, intermediate, attention, kv = MODELS[model]
    named = {
        "q": (hidden, attention),
        "k": (hidden, kv),
        "v": (hidden, kv),
        "o": (attention, hidden),
        "gate": (hidden, intermediate),
        "up": (hidden, intermediate),
        "down": (intermediate, hidden),
    }
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, shape in named.items():
        shapes.setdefault(shape, []).append(name)
    return shapes


def graph_ms(fn, device: torch.device, min_seconds: float, calls: int = 20) -> float:
    """Milliseconds per call of `calls` back-to-back calls captured in one CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()  # compiles the kernels before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return timed(graph.replay, device, min_seconds) / calls


def run_case(model, shape, names, num_tokens, args, device, dtype, with_triton: bool) -> Case:
    """Times one shape: always the reference; with_triton adds the Triton path and CUDA-graph replays."""
    in_features, out_features = shape
    x = torch.randn(num_tokens, in_features, device=device, dtype=dtype)
    a = (torch.randn(args.rank, in_features, device=device) / in_features**0.5).to(dtype)
    b = (torch.randn(out_features, args.rank, device=device) / args.rank**0.5).to(dtype)
    y_base = torch.randn(num_tokens, out_features, device=device, dtype=dtype)
    mask = (torch.arange(num_tokens, device=device) % 2).to(dtype)[:, None] if args.mixed else None
    y = {backend: y_base.clone() for backend in ("torch", "triton")}
    calls = {
        backend: lambda backend=backend: lora_expand(lora_shrink(x, a, 2.0), b, y[backend], mask)
        for backend in y
    }

    def measure(backend: str) -> tuple[float, float | None]:
        with use_backend(backend):
            eager = timed(calls[backend], device, args.min_seconds)
            graph = graph_ms(calls[backend], device, args.min_seconds) if with_triton else None
            y[backend].copy_(y_base)
            calls[backend]()
        return eager, graph

    torch_ms, torch_graph = measure("torch")
    if not with_triton:
        return Case(model, ",".join(names), *shape, num_tokens, torch_ms, None, None, None, None, None, None)
    triton_ms, triton_graph = measure("triton")
    diff = (y["triton"].float() - y["torch"].float()).abs().max().item()
    return Case(
        model,
        ",".join(names),
        *shape,
        num_tokens,
        torch_ms,
        triton_ms,
        torch_graph,
        triton_graph,
        torch_ms / triton_ms,
        torch_graph / triton_graph,
        diff,
    )


def layer_speedups(cases: list[Case], field_torch: str, field_triton: str) -> dict[str, float]:
    """Per model and token count: the time of all seven projections of one layer, reference over Triton."""
    totals: dict[str, list[float]] = {}
    for case in cases:
        weight = len(case.projections.split(","))
        total = totals.setdefault(f"{case.model}/T{case.num_tokens}", [0.0, 0.0])
        total[0] += weight * getattr(case, field_torch)
        total[1] += weight * getattr(case, field_triton)
    return {key: ref / fused for key, (ref, fused) in totals.items()}


def print_row(case: Case) -> None:
    fmt = lambda value, spec: "-" if value is None else format(value, spec)
    ratio = lambda value: "-" if value is None else f"{value:.2f}x"
    print(
        f"{case.model:>13} {case.projections:>7} {case.in_features:>5}x{case.out_features:<5} "
        f"{case.num_tokens:>4} {case.torch_ms:>9.4f} {fmt(case.triton_ms, '.4f'):>9} "
        f"{ratio(case.speedup):>7} {fmt(case.torch_graph_ms, '.4f'):>9} "
        f"{fmt(case.triton_graph_ms, '.4f'):>9} {ratio(case.graph_speedup):>7} "
        f"{fmt(case.max_abs_diff, '.2e'):>9}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--mixed", action="store_true", help="a 0/1 per-token mask (half the tokens on)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--min-seconds", type=float, default=0.05, help="timing window per measurement")
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    return args


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary(cases: list[Case], args: argparse.Namespace, device: torch.device) -> dict:
    """The JSON result: headline ratios first (the GPU check's table shows the first numeric fields)."""
    timed_triton = cases[0].triton_ms is not None
    return {
        "bench": "lora",
        "geomean_speedup": geomean([c.speedup for c in cases]) if timed_triton else None,
        "geomean_graph_speedup": geomean([c.graph_speedup for c in cases]) if timed_triton else None,
        "max_abs_diff": max(c.max_abs_diff for c in cases) if timed_triton else None,
        "rank": args.rank,
        "device": str(device),
        "triton_timed": timed_triton,
        "dtype": args.dtype,
        "mixed": args.mixed,
        "layer_speedup": layer_speedups(cases, "torch_ms", "triton_ms") if timed_triton else None,
        "layer_graph_speedup": (
            layer_speedups(cases, "torch_graph_ms", "triton_graph_ms") if timed_triton else None
        ),
        "cases": [asdict(case) for case in cases],
    }


def main() -> None:
    args = parse_args()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    if on_gpu:
        print(f"device {torch.cuda.get_device_name()}, {args.dtype}, rank {args.rank}, mixed={args.mixed}")
    else:
        print(
            "no CUDA device: timing the PyTorch reference only. The Triton kernels run on CPU only under "
            "TRITON_INTERPRET=1, which measures nothing about speed; run this on a GPU for the comparison."
        )
    print(
        f"{'model':>13} {'proj':>7} {'in x out':>11} {'T':>4} {'torch ms':>9} {'triton ms':>9} {'ratio':>7} "
        f"{'torch gr':>9} {'triton gr':>9} {'ratio':>7} {'max diff':>9}"
    )
    cases = []
    for model in args.models:
        for shape, names in projection_shapes(model).items():
            for num_tokens in args.tokens:
                dtype = getattr(torch, args.dtype)
                cases.append(run_case(model, shape, names, num_tokens, args, device, dtype, on_gpu))
                print_row(cases[-1])
    emit("lora", summary(cases, args, device))


if __name__ == "__main__":
    main()
