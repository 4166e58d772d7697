#!/usr/bin/env python3
"""A model that computes (almost) nothing: one logit per sample from the sum of its pooled
embeddings, times a weight, plus a bias. With it, a worker's samples/s is the pipeline's
own ceiling: the loader, the scheduler, the PS exchange and the embedding path, not the
dense model (scripts/bench_pipeline.py, docs/benchmarks.md "The pipeline's ceiling").

    python3 examples/models/null.py -o null.pt --tables 26 --dense 13 --dim 16
    ember-worker ... --model-file null.pt
"""
import torch

from common import parser, save


class Null(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((1,), 0.01))
        self.b = torch.nn.Parameter(torch.zeros(1))

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return emb.sum([1, 2]) * self.w + self.b


def main():
    a = parser("Write a model that computes nothing, to measure the pipeline's ceiling.").parse_args()
    torch.manual_seed(a.seed)
    save(Null(), a)


if __name__ == "__main__":
    main()
