"""The front door: LLMEngine.generate(prompts, SamplingParams) -> one GroupResult per prompt, built on
add_request + step, which a server calls itself to hand out each request's tokens as they are produced."""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping

import torch
from torch import nn
from tqdm import tqdm

from host.cpu_threads import adapt_cpu_threads
from pagedrl_kernels.backend import HAS_TRITON
from pagedrl_kernels.cpu_gemm import packed_weight_bytes
from rollout_engine.block_manager import BlockManager
from rollout_engine.constraints import ConstraintStats
from rollout_engine.kv_pool import commits_on_write
from rollout_engine.lora import LoraAdapter
from rollout_engine.memory import plan_kv_pool
from rollout_engine.model_runner import ModelRunner, order_for_step
from rollout_engine.models import build_paged_model, unwrap_model
from rollout_engine.outputs import GroupResult, StepOutput, TokenOutput
from rollout_engine.request_table import RequestTable
from rollout_engine.requests import check_prompt, params_per_prompt
from rollout_engine.sampling_params import SamplingParams, SamplingParamsError
from rollout_engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from rollout_engine.sequence import Sequence
from rollout_engine.step_sampling import SampledRow, sample_step
from rollout_engine.stopping import StopChecker
from rollout_engine.sync_contract import SyncStats, load_update, lora_layers

logger = logging.getLogger(__name__)


class LLMEngine:
    """Paged rollout engine over a transformers Llama / Qwen2 / Qwen3 model (optionally peft-wrapped).

    The engine reads the model's own weights at each step (on the CPU, fp32 projections through one MKL-packed
    copy of each weight, re-packed when the weight changes), keeps KV in one preallocated pool of
    `block_size`-token blocks sized from `memory_fraction`, and batches continuously. On CUDA, decode-only
    steps replay CUDA graphs captured at start-up (see cuda_graphs.py) unless `enforce_eager=True` or
    triton is not installed; on the CPU the engine always runs eagerly.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer=None,
        block_size: int = 16,
        memory_fraction: float = 0.35,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        memory_budget_bytes: int | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
    ) -> None:
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        config = unwrap_model(model).config
        self.max_model_len = max_model_len or config.max_position_embeddings
        self.lora = LoraAdapter(model) if lora_layers(model) else None
        self.model = build_paged_model(model, self.max_model_len, self.lora)
        weight = self.model.embed_tokens.weight
        self.vocab_size = weight.shape[0]
        # Decode steps replay CUDA graphs unless enforce_eager; their memory comes out of the same budget.
        # The graphs capture the Triton kernels: without triton (not installed off Linux x86_64) run eagerly.
        use_graphs = weight.device.type == "cuda" and not enforce_eager and HAS_TRITON
        pool = plan_kv_pool(
            self.model,
            config,
            block_size,
            memory_fraction,
            memory_budget_bytes,
            max_num_seqs,
            max_num_batched_tokens,
            self.max_model_len,
            use_graphs,
        )
        self.block_manager = BlockManager(pool.num_blocks, block_size)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens)
        self.runner = ModelRunner(self.model, pool.num_blocks, block_size, weight.dtype, weight.device)
        if use_graphs:
            self.runner.capture_graphs(max_num_seqs, self.block_manager.num_blocks_for(self.max_model_len))
        self.cuda_graph_bytes_reserved = pool.graph_bytes
        self.packed_weight_bytes_reserved = pool.packed_bytes
        logger.info(pool.report(self.runner.kv_bytes_total, commits_on_write(weight.device)))
        self.tokenizer = tokenizer
        self._requests = RequestTable()
        self._next_seq_id = 0
        self.num_prefill_tokens = 0
        self.num_generated_tokens = 0
        self.num_blocks_saved_by_sharing = 0
        self.constraint_stats = ConstraintStats()

    # requests

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> StopChecker:
        """The request's finish rules, once its params (validated again: they may have been edited since
        they were made) and its prompt are known to suit this engine; SamplingParamsError or PromptError (both
        ValueErrors) otherwise. It reads only settings fixed at construction, so any thread may call it."""
        params.validate()
        if params.n > self.scheduler.max_num_seqs:
            raise SamplingParamsError(
                "n",
                f"must be at most max_num_seqs={self.scheduler.max_num_seqs} (the samples of a request run "
                f"together), got {params.n}; raise max_num_seqs or lower n",
            )
        if params.constraint is not None and self.tokenizer is None:
            raise SamplingParamsError(
                "constraint", "needs the text of each token: pass a tokenizer to LLMEngine"
            )
        stop = StopChecker(params, self.tokenizer)
        check_prompt(prompt_token_ids, self.max_model_len, self.vocab_size)
        return stop

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Queue one prompt for params.n samples; returns its request id."""
        return self._queue(prompt_token_ids, params, self.check_request(prompt_token_ids, params))

    def _queue(self, prompt_token_ids: list[int], params: SamplingParams, stop: StopChecker) -> int:
        """Queue a checked request."""
        if self.lora is None and params.lora is not None:  # no adapter: every request samples the base model
            params = dataclasses.replace(params, lora=None)
        request_id = self._requests.add(prompt_token_ids, params.n, stop)
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**62)
        rngs = [random.Random(seed + i) for i in range(params.n)]
        self.scheduler.add(
            self._new_sequence(request_id, list(prompt_token_ids), len(prompt_token_ids), params, rngs)
        )
        return request_id

    def _new_sequence(
        self, request_id, token_ids, num_prompt_tokens, params, rngs, sample_index=0
    ) -> Sequence:
        self._next_seq_id += 1
        return Sequence(
            self._next_seq_id, request_id, token_ids, num_prompt_tokens, params, rngs, sample_index
        )

    def abort_request(self, request_id: int) -> None:
        """Drop a request's samples and free their KV blocks; an unknown or finished id is ignored."""
        self._requests.drop(request_id)
        self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        """Whether any added request still has samples running or waiting."""
        return self.scheduler.has_unfinished()

    # stepping

    def step(self) -> StepOutput:
        """Run one scheduled batch; returns every token it sampled (one per running sample, and a request's
        first tokens in the step that finishes its prompt) and the groups that finished in it.

        A step that raises aborts the requests it was running, whose state it left half-updated, and
        re-raises; the engine goes on serving every other request.
        """
        out = self.scheduler.schedule()
        if not out.scheduled:
            return StepOutput()
        if self.runner.device.type == "cpu":
            adapt_cpu_threads()
        try:
            return self._run(out)
        except BaseException:
            for request_id in {item.seq.request_id for item in out.scheduled}:
                self.abort_request(request_id)
            raise

    def _run(self, out: SchedulerOutput) -> StepOutput:
        self.runner.copy_blocks(out.copies)
        items = order_for_step(out.scheduled)
        rows_per_item = [
            item.seq.num_samples_at_next_token if item.samples_next_token else 0 for item in items
        ]
        logits = self.runner.run(self.runner.prepare(items, rows_per_item))
        sampling = [item.seq for item in items if item.samples_next_token]
        rows = sample_step(logits, sampling, self.tokenizer, self.constraint_stats)
        for item in items:
            self._advance(item)
        return self._process_samples(sampling, rows)

    def _advance(self, item: ScheduledSeq) -> None:
        seq = item.seq
        start = seq.num_computed_tokens
        self.num_prefill_tokens += max(0, min(item.num_new_tokens, seq.num_prompt_tokens - start))
        seq.num_computed_tokens += item.num_new_tokens
        self.block_manager.mark_computed(seq)

    def _process_samples(self, sampling: list[Sequence], rows: list[SampledRow]) -> StepOutput:
        out = StepOutput()
        row = iter(rows)
        for seq in sampling:
            group = [seq] + self._fork(seq) if seq.num_samples_at_next_token > 1 else [seq]
            for member in group:
                token, logprob, top, support = next(row)
                top = top[: member.params.top_logprobs]
                member.token_ids.append(token)
                member.logprobs.append(logprob)
                member.support.append(support)
                if top:
                    member.top_logprobs.append(top)
                self.num_generated_tokens += 1
                reason = self._finish_reason(member)
                out.tokens.append(
                    TokenOutput(member.request_id, member.sample_index, token, logprob, top, reason)
                )
                if reason is not None:
                    group_result = self._finish(member, reason)
                    if group_result is not None:
                        out.finished.append(group_result)
        return out

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """Split a group's prompt sequence into its n samples, all sharing the prompt's blocks."""
        children = [
            self._new_sequence(
                parent.request_id, list(parent.token_ids), parent.num_prompt_tokens, parent.params, [rng], i
            )
            for i, rng in enumerate(parent.rngs[1:], start=1)
        ]
        parent.rngs = parent.rngs[:1]
        self.scheduler.fork(parent, children)
        num_full_blocks = parent.num_computed_tokens // self.block_manager.block_size
        self.num_blocks_saved_by_sharing += len(children) * num_full_blocks
        return children

    def _finish_reason(self, seq: Sequence) -> str | None:
        reason = self._requests.stop_reason(seq)
        if reason is None and seq.num_tokens >= self.max_model_len:
            reason = "length"
        return reason

    def _finish(self, seq: Sequence, reason: str) -> GroupResult | None:
        """Retire a finished sample; returns its group once every sample of it has finished."""
        self.scheduler.finish(seq)
        return self._requests.finish(seq, reason)

    # front door

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
        on_finished: Callable[[int], None] | None = None,
    ) -> list[GroupResult]:
        """Sample params.n completions for every prompt; one GroupResult per prompt, in order.

        Each prompt is a list of token ids (tokenize text first; a tensor of ids is refused: pass
        tensor.tolist()). Everything is checked before anything is queued, and when a step raises (or the
        run is interrupted) every request of this call is aborted first, so the engine stays usable.
        ``on_finished(i)`` is called as the samples of prompt i are all finished (a caller's progress).
        """
        checked = self._check_batch(prompt_token_ids, params)
        request_ids: list[int] = []
        try:
            for prompt, (p, stop) in zip(prompt_token_ids, checked, strict=True):
                request_ids.append(self._queue(prompt, p, stop))
            results = self._run_to_completion(
                request_ids, sum(p.n for p, _ in checked), use_tqdm, on_finished
            )
        except BaseException:
            for request_id in request_ids:
                self.abort_request(request_id)
            raise
        self.runner.kv_bytes_resident()  # the pool's high-water mark is reached by the end of a call
        return [results[request_id] for request_id in request_ids]

    def _run_to_completion(
        self,
        request_ids: list[int],
        num_samples: int,
        use_tqdm: bool,
        on_finished: Callable[[int], None] | None,
    ) -> dict[int, GroupResult]:
        results: dict[int, GroupResult] = {}
        index_of = {request_id: i for i, request_id in enumerate(request_ids)}
        start, start_tokens = time.perf_counter(), self.num_generated_tokens
        with tqdm(total=num_samples, desc="rollout", unit="sample", disable=not use_tqdm) as bar:
            while len(results) < len(request_ids):
                for group in self.step().finished:
                    results[group.request_id] = group
                    bar.update(len(group.samples))
                    if on_finished is not None:
                        on_finished(index_of[group.request_id])
                rate = (self.num_generated_tokens - start_tokens) / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(tok_s=f"{rate:.0f}", refresh=False)
        return results

    def _check_batch(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams] | None
    ) -> list[tuple[SamplingParams, StopChecker]]:
        """Each prompt's params and finish rules, every prompt checked before any is queued, so bad input
        leaves no trace."""
        if self.scheduler.has_unfinished():
            raise ValueError("requests from add_request are still running: step() them to the end first")
        params_list = params_per_prompt(prompt_token_ids, params)
        return [
            (p, self.check_request(prompt, p))
            for prompt, p in zip(prompt_token_ids, params_list, strict=True)
        ]

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (call after each weight update); on the CPU the memory of every free
        block goes back to the system."""
        self.block_manager.reset_prefix_cache()
        ref_counts = self.block_manager.ref_counts
        self.runner.release_blocks(lambda block_id: ref_counts[block_id] == 0)

    # LoRA hot sync

    def lora_buffers(self) -> dict[str, torch.Tensor]:
        """The engine-owned LoRA tensors by sync name (`<module path>.lora_A` / `.lora_B`), or {}."""
        return self.lora.buffers() if self.lora is not None else {}

    def _adapter(self) -> LoraAdapter:
        if self.lora is None:
            raise ValueError("this engine was built without a LoRA adapter; build it from a peft model")
        return self.lora

    def set_lora_version(self, version: int) -> None:
        """Adopt a version whose weights were written into `lora_buffers()`; its stale KV is dropped."""
        self._adapter().version = version
        self.reset_prefix_cache()

    def update_lora(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> SyncStats:
        """Copy new LoRA weights into the engine's buffers in place, all validated before any is written (the
        old weights serve on any error), and adopt `version`, which must exceed the one it holds."""
        return load_update(self, named_tensors, version, self._adapter().version)

    def stats(self) -> dict[str, int | list[int]]:
        """Block usage now and at peak, sharing and cache counters, the KV pool's size in bytes (reserved,
        held in memory now and at most: on the CPU the pool takes pages as blocks are written and gives
        free blocks' pages back at each prefix-cache reset), and the CUDA graphs: captured batch sizes,
        their measured memory (and the amount reserved for them when the pool was sized), how many
        steps replayed one, and the bytes of CPU weights packed for MKL in this process (all engines'
        together: see pagedrl_kernels/cpu_gemm.py) beside what this engine's budget reserved for its own
        packs."""
        bm = self.block_manager
        graphs = self.runner.graphs
        return {
            "num_blocks_total": bm.num_blocks,
            "num_blocks_used": bm.num_used_blocks,
            "num_blocks_shared": bm.num_shared_blocks(),
            "num_blocks_peak": bm.num_blocks_peak,
            "num_blocks_saved_by_sharing": self.num_blocks_saved_by_sharing,
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_hits": bm.prefix_cache_hits,
            "num_prefill_tokens": self.num_prefill_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "constraint_checks": self.constraint_stats.checked,
            "constraint_vetoes": self.constraint_stats.vetoed,
            "constraint_unmet": self.constraint_stats.unmet,
            "constraint_supported": self.constraint_stats.supported,
            "constraint_support_nats": self.constraint_stats.support_nats,
            "kv_bytes_total": self.runner.kv_bytes_total,
            "kv_bytes_resident": self.runner.kv_bytes_resident(),
            "kv_bytes_resident_peak": self.runner.kv_bytes_resident_peak,
            "kv_bytes_per_block": self.runner.kv_bytes_total // bm.num_blocks,
            "cuda_graph_sizes": list(graphs.sizes) if graphs is not None else [],
            "cuda_graph_bytes": graphs.nbytes if graphs is not None else 0,
            "cuda_graph_bytes_reserved": self.cuda_graph_bytes_reserved,
            "cuda_graph_replays": graphs.num_replays if graphs is not None else 0,
            "packed_weight_bytes": packed_weight_bytes(),
            "packed_weight_bytes_reserved": self.packed_weight_bytes_reserved,
        }
