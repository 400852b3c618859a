"""The QLoRA fine-tuning experiment of notebooks 06-08, built on the Llama model floor (``helpers.llama``).

Plans run by one resumable runner (``runner``: store, budget, child processes, out-of-memory skipping): the
sweep (``sweep``; one point in its own process, ``sweep_point``, described by ``point_spec``), its re-timing
(``retime``) and the runs over several GPUs (``distributed``, ``fsdp_point``); what a card runs of them
(``card_plan``). The timed steps and AdamW (``timing``), generation speed (``generate``), the analysis
(``analysis``), the cross-GPU step model (``step_model``), its test across GPUs (``transfer``), a step's launch
timeline replayed with scaled kernels (``launch_replay``), and notebook
07's training step with the course's kernels (``kernels_step``, ``graphed_step``).

Import the submodules you need; none of them imports transformers, peft or bitsandbytes until a
model is built, so ``helpers.finetune.sweep`` stays light in the process that drives the sweep.
"""
