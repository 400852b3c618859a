"""The Llama model floor: the models, their data, LoRA, memory caps, the decoders and the one kernel set
that puts the course's kernels into a Llama. Nothing here imports a study, the experiment or the exercises."""
