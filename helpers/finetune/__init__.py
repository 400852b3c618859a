"""The QLoRA fine-tuning experiment: Llama-2 architectures in nf4 (``models``), LoRA with verified
gradient checkpointing (``lora``), the data and its offline stand-in (``data``), one measurement in
its own process (``point``: what it measures in ``spec``, its memory cap in ``memory_caps``, its timed
steps in ``timing``), generation speed (``generate``) and the resumable sweep (``sweep``).

Import the submodules you need; none of them imports transformers, peft or bitsandbytes until a
model is built, so ``helpers.finetune.sweep`` stays light in the process that drives the sweep.
"""
