#!/usr/bin/env python3
"""DLRM as Ember's built-in `--model dlrm` computes it (worker/src/model/model.cc): a bottom
MLP of the dense features to the embedding dimension, the pairwise dot products of it and
the embeddings, a top MLP of [bottom output, dots] to one logit. Its parameters are in the
built-in's order, so the two train the same model from the same weights.

    python3 examples/models/dlrm.py -o dlrm.pt --tables 26 --dense 13 --dim 16 --bottom 512-256-64 --top 512-256
    ember-worker ... --model-file dlrm.pt
"""
from typing import List

import torch

from common import add_activation, layers, mlp, parser, save


class Dlrm(torch.nn.Module):
    def __init__(self, tables: int, dense: int, dim: int, bottom: List[int], top: List[int], activation: str = "relu"):
        super().__init__()
        self.has_dense = dense > 0
        # Without dense features (Avazu) there is no bottom MLP: only the embeddings interact.
        self.bottom = mlp([dense] + bottom + [dim], act_last=True, activation=activation) if self.has_dense else torch.nn.Sequential()
        f = tables + (1 if self.has_dense else 0)
        tri = torch.tril_indices(f, f, -1)  # each pair once
        self.register_buffer("li", tri[0].clone())
        self.register_buffer("lj", tri[1].clone())
        self.top = mlp([(dim if self.has_dense else 0) + f * (f - 1) // 2] + top + [1], act_last=False, activation=activation)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        if self.has_dense:
            x = self.bottom(dense)
            z = torch.cat([x.unsqueeze(1), emb], 1)
        else:
            x = dense
            z = emb
        dots = torch.bmm(z, z.transpose(1, 2))
        pairs = dots[:, self.li, self.lj]
        t = torch.cat([x, pairs], 1) if self.has_dense else pairs
        return self.top(t).squeeze(1)


def main():
    p = parser("Write Ember's DLRM as a TorchScript model file.")
    p.add_argument("--bottom", default="512-256-64", help="bottom MLP (then the embedding dim), as ember-worker --bottom-mlp")
    p.add_argument("--top", default="512-256", help="top MLP (then 1), as ember-worker --top-mlp")
    add_activation(p)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    save(Dlrm(a.tables, a.dense, a.dim, layers(a.bottom), layers(a.top), a.activation), a)


if __name__ == "__main__":
    main()
