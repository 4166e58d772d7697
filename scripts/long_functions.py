#!/usr/bin/env python3
"""Lists the C++ functions of a folder longer than a limit, longest first.

    scripts/long_functions.py FOLDER [--limit N]   (default 80 lines)

A function is a brace block at namespace or class level whose opening line looks like a
definition (a name followed by a parameter list); its length counts the lines from its
signature's first line to its closing brace. Lambdas and nested blocks count towards the
function holding them. Comments and string literals are skipped when matching braces.
"""
import argparse
import pathlib
import re
import sys

SIG = re.compile(r"([~\w:<>]+)\s*\([^;{}]*\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(->\s*[\w:<>&*\s]+)?\s*(:[^{;]*)?$", re.S)
NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "namespace", "struct", "class", "enum", "union", "return"}


def strip(text):
    """Blanks comments and string/char literals, keeping newlines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = strip(path.read_text())
    depth_kinds = []  # per open brace: "scope" (namespace/class), "fn", or "block"
    start = 0  # where the text before the next brace begins
    found = []
    fn_open = None
    for i, c in enumerate(text):
        if c == "{":
            head = text[start:i].strip()
            inside_fn = "fn" in depth_kinds
            kind = "block"
            if not inside_fn:
                last = head.split(";")[-1].split("}")[-1].strip()
                m = SIG.search(last)
                words = re.findall(r"\w+", last)
                if re.search(r"\b(namespace|class|struct|union|enum)\b", last) and not m:
                    kind = "scope"
                elif m and m.group(1).split("::")[-1] not in NOT_FUNCTIONS and words and words[0] not in NOT_FUNCTIONS:
                    kind = "fn"
                    first = text.count("\n", 0, i - len(text[start:i]) + text[start:i].find(last)) + 1
                    fn_open = (m.group(1), first)
                elif last.startswith("extern") or not last:
                    kind = "scope"
            depth_kinds.append(kind)
            start = i + 1
        elif c == "}":
            kind = depth_kinds.pop() if depth_kinds else "block"
            if kind == "fn" and fn_open is not None:
                name, first = fn_open
                found.append((text.count("\n", 0, i) + 1 - first + 1, name, first))
                fn_open = None
            start = i + 1
        elif c == ";" and "fn" not in depth_kinds:
            start = i + 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--limit", type=int, default=80)
    args = ap.parse_args()
    rows = []
    for path in sorted(pathlib.Path(args.folder).rglob("*")):
        if path.suffix in (".cc", ".h", ".cpp", ".hpp", ".cu"):
            rows += [(n, name, f"{path}:{line}") for n, name, line in functions(path)]
    rows.sort(key=lambda r: -r[0])
    long_ones = [r for r in rows if r[0] > args.limit]
    for n, name, where in long_ones:
        print(f"{n:5d}  {name}  {where}")
    print(f"{len(long_ones)} of {len(rows)} functions over {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
