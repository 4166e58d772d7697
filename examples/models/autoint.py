#!/usr/bin/env python3
"""AutoInt (Song et al., CIKM 2019), a model Ember has no built-in for: every feature a
field of dimension dim (the dense features projected to one more), fields attending to
each other through layers of multi-head self-attention with residual connections, then
one linear layer of all fields to the logit.

    python3 examples/models/autoint.py -o autoint.pt --tables 26 --dense 13 --dim 16 --layers 2 --heads 2
"""
import torch

from common import parser, save


class InteractingLayer(torch.nn.Module):
    """Multi-head self-attention over the fields, with a residual projection and a ReLU."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        assert dim % heads == 0, "--dim must be a multiple of --heads"
        self.heads = heads
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.k = torch.nn.Linear(dim, dim, bias=False)
        self.v = torch.nn.Linear(dim, dim, bias=False)
        self.res = torch.nn.Linear(dim, dim, bias=False)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """[B, F, D] -> [B, heads, F, D / heads]."""
        return t.view(t.size(0), t.size(1), self.heads, t.size(2) // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scale = float(x.size(2) // self.heads) ** 0.5
        att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) / scale, -1)
        out = torch.matmul(att, v).transpose(1, 2).reshape(x.size(0), x.size(1), x.size(2))
        return torch.relu(out + self.res(x))


class AutoInt(torch.nn.Module):
    def __init__(self, tables: int, dense: int, dim: int, layers: int, heads: int):
        super().__init__()
        self.has_dense = dense > 0
        self.dense_field = torch.nn.Linear(max(dense, 1), dim)
        self.layers = torch.nn.ModuleList([InteractingLayer(dim, heads) for _ in range(layers)])
        self.out = torch.nn.Linear((tables + (1 if self.has_dense else 0)) * dim, 1)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.dense_field(dense).unsqueeze(1), emb], 1) if self.has_dense else emb
        for layer in self.layers:
            x = layer(x)
        return self.out(x.flatten(1)).squeeze(1)


def main():
    p = parser("Write AutoInt as a TorchScript model file.")
    p.add_argument("--layers", type=int, default=2, help="interacting (self-attention) layers")
    p.add_argument("--heads", type=int, default=2, help="attention heads (a divisor of --dim)")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    save(AutoInt(a.tables, a.dense, a.dim, a.layers, a.heads), a)


if __name__ == "__main__":
    main()
