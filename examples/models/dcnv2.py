#!/usr/bin/env python3
"""MLPerf Training's DLRM-DCNv2, as Ember's built-in `--model dcnv2`: a bottom MLP of the
dense features to the embedding dimension beside the embeddings, x0 = [bottom(dense), emb
flattened]; low-rank cross layers x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l; a top MLP of
x_L to one logit. MLPerf's: bottom 512-256-128, 3 cross layers of rank 512, top
1024-1024-512-256, dim 128.

    python3 examples/models/dcnv2.py -o dcnv2.pt --dim 128 --bottom 512-256 --top 1024-1024-512-256 --layers 3 --rank 512
"""
from typing import List

import torch

from common import add_activation, layers, mlp, parser, save


class LowRankCross(torch.nn.Module):
    def __init__(self, width: int, rank: int):
        super().__init__()
        self.v = torch.nn.Linear(width, rank, bias=False)
        self.w = torch.nn.Linear(rank, width)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.w(self.v(x)) + x


class DcnV2(torch.nn.Module):
    def __init__(self, tables: int, dense: int, dim: int, bottom: List[int], top: List[int], cross_layers: int, rank: int, activation: str = "relu"):
        super().__init__()
        self.has_dense = dense > 0
        self.bottom = mlp([dense] + bottom + [dim], act_last=True, activation=activation) if self.has_dense else torch.nn.Sequential()
        width = (tables + (1 if self.has_dense else 0)) * dim
        self.cross = torch.nn.ModuleList([LowRankCross(width, rank) for _ in range(cross_layers)])
        self.top = mlp([width] + top + [1], act_last=False, activation=activation)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([self.bottom(dense), emb.flatten(1)], 1) if self.has_dense else emb.flatten(1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.top(x).squeeze(1)


def main():
    p = parser("Write MLPerf's DLRM-DCNv2 as a TorchScript model file.")
    p.add_argument("--bottom", default="512-256-64", help="bottom MLP (then the embedding dim), as ember-worker --bottom-mlp")
    p.add_argument("--top", default="512-256", help="top MLP (then 1), as ember-worker --top-mlp")
    p.add_argument("--layers", type=int, default=3, help="cross layers, as ember-worker --cross-layers")
    p.add_argument("--rank", type=int, default=512, help="rank of each cross layer, as ember-worker --cross-rank")
    add_activation(p)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    save(DcnV2(a.tables, a.dense, a.dim, layers(a.bottom), layers(a.top), a.layers, a.rank, a.activation), a)


if __name__ == "__main__":
    main()
