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


def add_activation(p):
    """--activation, for the models with MLPs."""
    p.add_argument("--activation", default="relu", choices=sorted(ACTIVATIONS),
                   help="the MLPs' activation (relu: the built-in model's; softplus or gelu: smooth)")


# The MLPs' activations (--activation). ReLU is the built-in models'. A smooth one
# (softplus, gelu) has no kink at 0: with it, two runs whose floats are summed in another
# order (vanilla and herald split a batch differently) stay within rounding of each
# other, where ReLU can turn a 1e-7 difference into a different gradient for a sample
# whose pre-activation sits at 0 (docs/training.md "Same model, whatever the policy").
ACTIVATIONS = {"relu": torch.nn.ReLU, "softplus": torch.nn.Softplus, "gelu": torch.nn.GELU}


def mlp(sizes, act_last, activation="relu"):
    """Linear layers of `sizes` (input first) with an activation between them, and after
    the last with act_last: with relu, the built-in models' MLPs, parameter for parameter."""
    mods = []
    for i in range(len(sizes) - 1):
        mods.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes) or act_last:
            mods.append(ACTIVATIONS[activation]())
    return torch.nn.Sequential(*mods)


def save(model, args):
    """Scripts `model`, checks it on one batch of the dataset's shape, writes it."""
    scripted = torch.jit.script(model)
    out = scripted(torch.zeros(2, args.dense), torch.zeros(2, args.tables, args.dim))
    assert out.shape == (2,) and out.dtype == torch.float32, f"forward must return [B] float32 logits, not {tuple(out.shape)} {out.dtype}"
    scripted.save(args.output)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.output}: {type(model).__name__}, {n:,} parameters, {args.tables} tables of dim {args.dim}, {args.dense} dense")
