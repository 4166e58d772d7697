#!/usr/bin/env python3
"""Lists the C++ functions (and lambdas) and the scripts' Python functions longer than a
limit, longest first: where the code is hard to read. With --fail it is a gate (exit 1
when it finds any; the test suite's NoFunctionOver80Lines).

  scripts/long_functions.py                 # every module and scripts/, over 80 lines
  scripts/long_functions.py --limit 60 scheduler ps
  scripts/long_functions.py --fail          # exit 1 if any

It reads clang-formatted sources (the project's style): a definition is a line ending in
`{` after a closing parenthesis, outside control statements, and its body ends at the
first `}` indented as the definition's first line.
"""
import argparse
import ast
import re
import sys
from pathlib import Path

MODULES = ["common", "data", "cache", "scheduler", "transport", "ps", "worker", "serve", "planner", "monitor", "sim", "bench"]
CONTROL = re.compile(r"^\s*(\}\s*)?(if|for|while|switch|else|do|catch|try|namespace|class|struct|enum|union|extern)\b")
NAME = re.compile(r"([~\w:]+(?:<[^()]*>)?|operator\S+)\s*\(")


def functions(path):
    lines = path.read_text(errors="replace").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if stripped.endswith("{") and ")" in stripped and not CONTROL.match(line) and not stripped.lstrip().startswith("//"):
            # The statement's first line: walk back over continuation lines.
            start = i
            while start > 0:
                prev = lines[start - 1].rstrip()
                if not prev or prev.endswith((";", "{", "}", ":")) or prev.lstrip().startswith(("//", "#", "template")):
                    break
                start -= 1
            head = " ".join(l.strip() for l in lines[start : i + 1])
            if CONTROL.match(lines[start]) or "=" in head.split("(")[0] and "[" not in head:
                i += 1
                continue
            indent = len(lines[start]) - len(lines[start].lstrip())
            end = None
            for j in range(i + 1, len(lines)):
                l = lines[j]
                if l.strip() in ("}", "};", "});", "}));") and len(l) - len(l.lstrip()) == indent:
                    end = j
                    break
            if end is None:
                i += 1
                continue
            m = NAME.search(head)
            name = m.group(1) if m else head[:40]
            if "[" in head.split("(")[0]:
                name = "lambda in " + name if m else "lambda"
            yield name, start + 1, end - start + 1
            if indent == 0 or "lambda" not in name:
                i = end + 1 if indent == 0 else i + 1
                continue
        i += 1


def python_functions(path):
    """(name, first line, lines) of every function of a Python file, nested ones too."""
    for n in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield n.name, n.lineno, n.end_lineno - n.lineno + 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="*", default=MODULES, help="folders to scan (default: every module)")
    p.add_argument("--limit", type=int, default=80, help="report functions over this many lines")
    p.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    p.add_argument("--fail", action="store_true", help="exit 1 when a function is over the limit")
    a = p.parse_args()
    if a.modules == MODULES:
        a.modules = MODULES + ["scripts"]
    root = Path(a.root)
    found = []
    for m in a.modules:
        for f in sorted((root / m).rglob("*")):
            if f.suffix in (".cc", ".h", ".cu", ".py") and f.is_file():
                for name, line, n in (python_functions(f) if f.suffix == ".py" else functions(f)):
                    if n > a.limit:
                        found.append((n, f"{f.relative_to(root)}:{line}", name))
    for n, where, name in sorted(found, reverse=True):
        print(f"{n:5d}  {where}  {name}")
    print(f"long_functions: {len(found)} functions over {a.limit} lines in {', '.join(a.modules)}", file=sys.stderr)
    if a.fail and found:
        sys.exit(1)


if __name__ == "__main__":
    main()
