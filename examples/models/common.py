"""What every example model file shares: the command line, and writing the module as
TorchScript that `ember-worker --model-file` loads (docs/training.md "Your own model")."""
import argparse

import torch


def layers(text):
    """'512-256-64' -> [512, 256, 64]; '' -> []."""
    return [int(x) for x in text.split("-") if x]


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-o", "--output", required=True, help="the TorchScript file to write")
    p.add_argument("--tables", type=int, default=26, help="embedding tables (the dataset's: Criteo 26, Avazu 22)")
    p.add_argument("--dense", type=int, default=13, help="dense features (Criteo 13, Avazu 0)")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension (ember-ps --dim)")
    p.add_argument("--seed", type=int, default=1, help="the initial weights' seed (every worker loads the file's weights)")
    return p


def mlp(sizes, relu_last):
    """Linear layers of `sizes` (input first) with a ReLU between them, and after the last
    with relu_last: the built-in models' MLPs, parameter for parameter."""
    mods = []
    for i in range(len(sizes) - 1):
        mods.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes) or relu_last:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def save(model, args):
    """Scripts `model`, checks it on one batch of the dataset's shape, writes it."""
    scripted = torch.jit.script(model)
    out = scripted(torch.zeros(2, args.dense), torch.zeros(2, args.tables, args.dim))
    assert out.shape == (2,) and out.dtype == torch.float32, f"forward must return [B] float32 logits, not {tuple(out.shape)} {out.dtype}"
    scripted.save(args.output)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.output}: {type(model).__name__}, {n:,} parameters, {args.tables} tables of dim {args.dim}, {args.dense} dense")
