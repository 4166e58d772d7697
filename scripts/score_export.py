#!/usr/bin/env python3
"""Scores a raw Criteo TSV file with a model written by ember-export, in PyTorch alone.

An example of using an export without Ember: the tables are read with torch.load, the
dense model with torch.jit.load, and the raw values are mapped to rows through the
export's vocab.bin as ember-data prep mapped them (docs/export.md). Prints the AUC and
log loss when the file has labels, and with -o writes one probability per line, as
ember-predict does.

  python3 scripts/score_export.py --export DIR FILE.tsv [-o preds.txt]

Criteo TSV only (label, I1..I13, C1..C26; test.txt without the label): an Avazu value's
key is the XXH3-64 hash of its bytes, which needs a package beyond PyTorch. Needs
PyTorch and NumPy (Debian: python3-torch; use /usr/bin/python3).
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch


def read_vocabulary(path, rows):
    """Per table: (sorted keys, their rows), from vocab.bin (data/vocabulary.h)."""
    buf = Path(path).read_bytes()
    magic, version, tables = struct.unpack_from("<8sII", buf, 0)
    if magic != b"EMBRVOCB" or version != 1:
        sys.exit(f"{path}: not an Ember vocabulary (version 1)")
    pos, out = 16, []
    for t in range(tables):
        values, key_bytes, _ = struct.unpack_from("<QII", buf, pos)
        pos += 16
        keys = np.frombuffer(buf, dtype="<u4" if key_bytes == 4 else "<u8", count=values, offset=pos).astype(np.uint64)
        pos += (values * key_bytes + 7) // 8 * 8
        if values + 2 != rows[t]:
            sys.exit(f"{path}: table {t} has {values + 2} rows, the export {rows[t]}")
        order = np.argsort(keys, kind="stable")
        out.append((keys[order], order.astype(np.int64) + 2))  # row 0: missing, row 1: OOV
    return out


def rows_of(vocab, column):
    """Rows of one table's raw hexadecimal values ('' = missing -> 0; unknown -> OOV 1)."""
    keys, rows = vocab
    missing = np.array([v == "" for v in column])
    q = np.array([int(v, 16) if v else 0 for v in column], dtype=np.uint64)
    at = np.minimum(np.searchsorted(keys, q), max(len(keys) - 1, 0))
    found = (keys[at] == q) if len(keys) else np.zeros(len(q), bool)
    return np.where(missing, 0, np.where(found, rows[at] if len(keys) else 1, 1))


def auc(p, y):
    """ROC AUC with tied scores given their average rank."""
    order = np.argsort(p, kind="stable")
    ps, ranks = p[order], np.empty(len(p))
    i = 0
    while i < len(p):
        j = i
        while j + 1 < len(p) and ps[j + 1] == ps[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y.sum()
    neg = len(y) - pos
    return 0.5 if pos == 0 or neg == 0 else (ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", required=True, help="the directory ember-export wrote (as ember-predict --export)")
    ap.add_argument("file", help="Criteo TSV file")
    ap.add_argument("-o", "--output", help="write one probability per line here")
    ap.add_argument("--batch", type=int, default=4096)
    if "--model" in sys.argv[1:]:
        ap.error("--model is now called --export")
    a = ap.parse_args()
    d = Path(a.export)
    m = json.loads((d / "manifest.json").read_text())
    if m["source_format"] != "criteo" or m["vocabulary"] is None:
        sys.exit(f"{d}: this example reads Criteo TSV exports with a vocabulary")
    if "multi_hot_sep" in m:
        sys.exit(f"{d}: a multi-hot export (bags pooled by {m['model'].get('pooling', 'sum')}); this example reads one-hot "
                 "exports: score it with ember-predict")
    tables = [torch.load(d / t["file"]) for t in m["tables"]]
    model = torch.jit.load(str(d / "dense.pt"))
    vocab = read_vocabulary(d / m["vocabulary"]["file"], [t["rows"] for t in m["tables"]])

    lines = [l.rstrip("\r\n").split("\t") for l in open(a.file) if l.strip()]
    labeled = len(lines[0]) == 40
    f = np.array([l[1:] if labeled else l for l in lines], dtype=object)
    dense = np.array([[float(v) if v else 0.0 for v in row] for row in f[:, :13]])
    dense = np.log1p(np.maximum(dense, 0.0)).astype(np.float32)  # as prep: log(1 + max(x, 0)), in double
    ids = np.stack([rows_of(vocab[t], f[:, 13 + t]) for t in range(26)], 1)
    probs = []
    with torch.no_grad():
        for b in range(0, len(lines), a.batch):
            x = torch.from_numpy(dense[b:b + a.batch])
            emb = torch.stack([tables[t][torch.from_numpy(ids[b:b + a.batch, t])] for t in range(26)], 1)
            probs.append(model.probability(x, emb).numpy())
    p = np.concatenate(probs)
    if a.output:
        Path(a.output).write_text("".join(f"{v:.9g}\n" for v in p))
    if labeled:
        y = np.array([int(l[0]) for l in lines])
        q = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
        ll = -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))
        print(json.dumps({"samples": len(p), "auc": auc(p.astype(np.float64), y), "logloss": ll}))
    else:
        print(json.dumps({"samples": len(p)}))


if __name__ == "__main__":
    main()
