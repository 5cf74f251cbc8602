"""DFlash drafter trainer: a frozen Qwen3 target feeds hidden states to a small block-diffusion
drafter trained to predict the next ``block_size - 1`` tokens after each anchor.

Launch commands::

    # CPU smoke test (the README demo; tiny random target, dense-mask SDPA attention)
    python -m remote_payload.trainer --preset tiny --device cpu --attn sdpa --steps 40

    # one GPU, Qwen3-8B-shaped random target (or --target-path /models/Qwen3-8B)
    python -m remote_payload.trainer --preset qwen3-8b --steps 1000 --out-dir runs/q8

    # 8 GPUs, 5 target + 3 drafter ranks, self-spawned (one process per GPU)
    python -m remote_payload.trainer --preset qwen3-8b --nproc 8 --topology split --target-ranks 5

    # the same under torchrun
    torchrun --nproc-per-node 8 -m remote_payload.trainer --preset qwen3-8b --topology split \\
        --target-ranks 5

    # seed the compile cache: compile every shape bucket once, save mega-cache artifacts, exit
    python -m remote_payload.trainer --preset qwen3-8b --warmup-only \\
        --save-cache-artifacts /opt/opsctl/cache/<fp>/mega.bin

Importing this package has no side effects and does not import torch; ``main()`` applies
all compile settings.
"""

from __future__ import annotations
