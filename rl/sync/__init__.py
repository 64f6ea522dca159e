"""The LoRA adapter and weight sync: peft setup, the adapter's tensors under the engine's names, and the
transports that push them (in-process, or over torch.distributed)."""
