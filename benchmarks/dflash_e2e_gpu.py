"""The DFlash recipe end to end on one GPU, in minutes, without downloads; prints one JSON.

    python3 benchmarks/dflash_e2e_gpu.py --minutes 6      # one H200
    python3 benchmarks/dflash_e2e_gpu.py --tiny           # the CPU check of this script
    python3 benchmarks/dflash_e2e_gpu.py --fp8-compare --minutes 8   # + what FP8 features cost

What runs (``remote_payload/trainer/e2e.py``, ``--size gpu``): a 512-wide, 8-layer Qwen3
target is trained on a toy chat language until confident; it regenerates 8192 answers
(``transformers`` generate with a static cache, or vLLM if installed); a 4-layer drafter
reading 3 target layers trains on them for 6 epochs (block 16, 64 anchors, flex attention,
torch.compile); ``eval`` measures tau of the trained and of an untrained drafter. The last
stdout line is the JSON summary: tau, tau_untrained, per_position, regenerate_tok_s,
train_tok_s, train_mfu (vs the 989 TFLOP/s datasheet peak), train_mfu_matmul (vs the
measured 790), and the seconds of each stage.

``--fp8-compare``: after that, a second drafter trains from the same seed on FP8 features
(``--target-precision fp8``), and tau is measured for both drafters against the bf16 target
(the one served) and an FP8-served one: the summary's ``fp8_compare`` (``--tiny`` runs the
FP8 legs on the CPU, where torch's FP8 GEMM runs too).

The script ends itself: after ``--minutes`` it dumps every thread's stack to stderr and
exits (faulthandler), so a hang never holds the GPU past the budget.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import pathlib
import sys
import tempfile
import time

# multicast off before torch (and NCCL) load: see KINDS.md of the device machines
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=6.0, help="hard deadline (stack dump, exit)")
    p.add_argument("--tiny", action="store_true", help="CPU, tiny shape: checks the script")
    p.add_argument("--out-dir", default=None, help="keep the artefacts here (default: a temp dir)")
    p.add_argument("--fp8-compare", action="store_true",
                   help="also train on FP8 features; tau of both drafters vs bf16/FP8 targets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drafter-epochs", type=int, default=None, help="instead of the recipe's 6")
    p.add_argument("--json", dest="json_out", default=None, help="the result file (default: stdout)")
    a = p.parse_args()
    faulthandler.dump_traceback_later(a.minutes * 60, exit=True)
    import torch

    from benchmarks import harness
    from remote_payload.trainer import e2e

    if a.tiny:
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("error: no CUDA device (use --tiny for the CPU check)", file=sys.stderr)
        return 2
    out = a.out_dir or tempfile.mkdtemp(prefix="dflash-e2e-")
    t0 = time.perf_counter()
    summary = e2e.run(["--out-dir", out, "--size", "tiny" if a.tiny else "gpu",
                       "--device", "cpu" if a.tiny else "cuda", "--seed", str(a.seed),
                       *(["--fp8-compare"] if a.fp8_compare else []),
                       *([] if a.drafter_epochs is None else
                         ["--drafter-epochs", str(a.drafter_epochs)])])
    summary.update(total_s=round(time.perf_counter() - t0, 1), torch=torch.__version__,
                   gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                   date=time.strftime("%Y-%m-%d"), out_dir=out)
    faulthandler.cancel_dump_traceback_later()
    harness.write_result("dflash_e2e_gpu", summary, a.json_out,
                         params={k: v for k, v in vars(a).items() if k != "json_out"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
