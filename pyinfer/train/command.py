"""`pyinfer relufy`: ReLU-fy a model by distillation (needs PyTorch: pip install "pyinfer[train]")."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from ..errors import PyinferError

EPILOG = """examples:
  pyinfer relufy -o smollm2-relu.gguf --data ../shared/data/pride-and-prejudice.txt --tokens 4096 --plot curve.png
  pyinfer relufy -o ffn.gguf --ffn-only --device cuda --tokens 20000000 --data a.txt b.txt --self-text 100000
  pyinfer relufy --merge ffn.gguf -o smollm2-relu.gguf        # put an --ffn-only file back into the model

Swaps the gate's activation for ReLU (ReGLU, as ReluLLaMA did) and trains the FFN by distillation from the
original model: KL on its next-token distributions (in vocabulary chunks) plus the text's cross-entropy,
with ProSparse's L1 penalty on the gate activations rising in stages until --target-sparsity. The data is
your texts (--data) and, with --self-text N, N tokens the original model writes itself. Progress shows loss,
sparsity and tokens/s; a checkpoint beside OUT lets --resume continue. The export keeps every other tensor's
bytes, re-quantizes the FFN to its source type and records the activation, so `pyinfer profile`,
`train-predictors` and `--sparsity` treat it as a ReLU-family model."""


def add_parser(sub, model_args) -> None:
    p = sub.add_parser("relufy", help="ReLU-fy a model by distillation (PyTorch; pip install 'pyinfer[train]')",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    model_args(p)
    p.add_argument("-o", "--output", required=True, help="GGUF to write")
    p.add_argument("--data", nargs="+", default=[], metavar="TEXT", help="training text files (never evaluation text)")
    p.add_argument("--self-text", type=int, default=0, metavar="N", help="also train on N tokens the model writes")
    p.add_argument("--tokens", type=int, default=4096, help="training tokens (default 4096)")
    p.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: --tokens decides)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--l1", type=float, default=1e-3,
                   help="the L1 factor's last stage, on each token's summed |activation| (default 1e-3)")
    p.add_argument("--target-sparsity", type=float, default=0.9, help="stop raising the L1 factor here (0.9)")
    # dest: the engine's own --device (cli._load) must not see PyTorch's.
    p.add_argument("--device", dest="train_device", default="cpu", help="cpu or cuda (bf16 autocast on cuda)")
    p.add_argument("--ffn-only", action="store_true", help="write only the FFN tensors (merge with --merge)")
    p.add_argument("--merge", metavar="FFN_GGUF", help="write the model with this --ffn-only file's FFN instead")
    p.add_argument("--resume", action="store_true", help="continue from OUT's checkpoint")
    p.add_argument("--plot", metavar="PNG", help="loss and sparsity curve (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print one JSON object of figures")


def _torch():
    try:
        import torch
    except ImportError:
        raise PyinferError("relufy needs PyTorch: pip install 'pyinfer[train]' (or pip install torch)") from None
    return torch


def training_ids(model, files: list[str], self_tokens: int, seed: int = 0):
    import numpy as np

    texts = []
    for f in files:
        try:
            texts.append(Path(f).read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            raise PyinferError(f"cannot read {f}: {e.strerror}") from None
    if self_tokens > 0:  # text the teacher writes itself: no hub, no network
        prompts = ["Once upon a time", "The history of", "In this chapter we", "Dear friend,", "How to"]
        written, count = [], 0
        for i in range(max(1, self_tokens // 8)):  # a bound: generations may stop early
            if count >= self_tokens:
                break
            t = model.generate(prompts[i % len(prompts)], max_tokens=256, temperature=0.8, seed=seed + i)
            written.append(t)
            count += len(model.tokenize(t))
        texts += written
    if not texts:
        raise PyinferError("relufy needs training text: --data FILE ... and/or --self-text N")
    return np.array(model.tokenize("\n\n".join(texts)), dtype=np.int64)


def cmd_relufy(args, load) -> int:
    from .export import merge

    if args.merge:
        model = load(args, device="cpu", vram_budget=None)
        merge(model.path, args.merge, args.output)
        print(f"pyinfer: wrote {args.output}", file=sys.stderr)
        return 0
    torch = _torch()
    if args.tokens < 1 or args.seq_len < 2 or args.batch < 1:
        raise PyinferError("--tokens, --seq-len and --batch must be positive (--seq-len at least 2)")
    if args.train_device.startswith("cuda") and not torch.cuda.is_available():
        raise PyinferError("--device cuda: PyTorch sees no GPU")
    from .distill import DistillConfig, distill, write_curve
    from .export import export
    from .torch_llama import Llama

    model = load(args, device="cpu", vram_budget=None)
    ids = training_ids(model, args.data, args.self_text)
    if model.config.activation.name != "SILU":
        raise PyinferError(f"relufy starts from a SiLU-gated model; this one's FFN is already "
                           f"{model.config.activation.name.lower()}")
    teacher = Llama(model.gguf, "silu").to(args.train_device)
    student = Llama(model.gguf, "relu").to(args.train_device)
    cfg = DistillConfig(tokens=args.tokens, seq_len=args.seq_len, batch=args.batch, lr=args.lr, l1=args.l1,
                        target_sparsity=args.target_sparsity, max_seconds=60 * args.minutes)
    out = Path(args.output)
    curve = distill(teacher, student, ids, cfg, out.with_name(out.name + ".ckpt"), args.resume,
                    device=args.train_device)
    ffn = {f"blk.{il}.{n}.weight": getattr(b, n).detach().float().cpu().numpy()
           for il, b in enumerate(student.blocks) for n in ("ffn_gate", "ffn_up", "ffn_down")}
    notes = export(model.path, ffn, out, ffn_only=args.ffn_only)
    write_curve(curve, out.with_name(out.name + ".curve.json"))
    if args.plot:
        plot_curve(curve, args.plot)
    rate = round(curve.tokens[-1] / max(curve.seconds, 1e-9), 1)
    figures = {"output": str(out), "bytes": out.stat().st_size, "sha256": _sha256(out), "tokens": curve.tokens[-1],
               "seconds": round(curve.seconds, 1), "tokens_per_s": rate,
               "loss_first": curve.loss[0], "loss_last": curve.loss[-1], "sparsity_first": curve.sparsity[0],
               "sparsity_last": curve.sparsity[-1], "notes": notes, "command": "pyinfer " + " ".join(sys.argv[1:])}
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"pyinfer: wrote {out} ({figures['bytes'] / 2**20:.1f} MiB): {figures['tokens']} tokens in "
              f"{figures['seconds']} s, loss {curve.loss[0]:.3f} -> {curve.loss[-1]:.3f}, FFN sparsity "
              f"{curve.sparsity[0]:.1%} -> {curve.sparsity[-1]:.1%}" + "".join(f"\n  {n}" for n in notes),
              file=sys.stderr)
        if args.ffn_only:
            print(f"merge: pyinfer relufy -m {model.path} --merge {out} -o MODEL-relu.gguf", file=sys.stderr)
    return 0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plot_curve(curve, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PyinferError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(curve.tokens, curve.loss, label="loss (KL + 0.5 CE)", color="tab:blue")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(curve.tokens, curve.sparsity, label="FFN sparsity", color="tab:red")
    ax2.set_ylabel("share of zero gate activations")
    ax2.set_ylim(0, 1)
    fig.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
