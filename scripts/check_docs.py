#!/usr/bin/env python3
"""Checks Ember's Markdown documentation (README.md, CONTRIBUTING.md, docs/*.md):

  (a) every relative link target exists, relative to the file that links to it
      (http(s), mailto and other schemes and pure #anchors are skipped; a #fragment is
      stripped);
  (b) every command-line flag the docs name for an Ember program exists in that
      program's --help. Invocations of the programs are found in fenced code blocks and
      inline code spans; the --flags that follow a program on its command (up to a pipe,
      ;, && or ||, or a bare `--`) are checked against its help. After a bare `--`, the
      launchers (ember_launch.py, launch_hosts.sh/.py, ember.sbatch) pass the arguments on to
      ember-worker, so those are checked against ember-worker; the quoted value of
      --ps-args is checked against ember-ps. An inline span that starts with a flag and
      names no program (`--cache-ratio`) is checked against the flags of all programs.

Prints one line `FILE:LINE: message` per problem and exits 1 if there is any; otherwise
prints a one-line summary and exits 0. Exits 2, with one line, when a binary is missing
or a program's --help fails.

  python3 scripts/check_docs.py [--root DIR] [--bin-dir DIR]
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

BINARIES = ("ember-ps", "ember-worker", "ember-data", "ember-sim", "ember-bench", "ember-export", "ember-predict", "ember-plan", "ember-serve")
PY_SCRIPTS = ("ember_launch.py", "launch_hosts.py", "bench_e2e.py", "experiments.py", "compare_runs.py")
# Shell scripts that only run a Python one (its flags are theirs).
WRAPPERS = {"launch_hosts.sh": "launch_hosts.py"}
# Shell scripts: their flags are the `--x)` patterns of their option loop.
SH_SCRIPTS = ("ember.sbatch", "slurm_local.sh", "cluster_local.sh", "device_check.sh", "device_build.sh")
# Programs that hand everything after a bare `--` to every ember-worker.
FORWARD_TO_WORKER = {"ember_launch.py", "launch_hosts.py", "ember.sbatch"}
# Options whose (quoted) value is a list of ember-ps arguments.
PS_ARGS = {("ember_launch.py", "--ps-args"), ("launch_hosts.py", "--ps-args")}
SEPARATORS = {"|", "||", "&&", ";", "&"}
FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9_-]*")
TOKEN_FLAG_RE = re.compile(r"^[\[(]*(--[A-Za-z][A-Za-z0-9_-]*)")
FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
SPAN_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
LINK_RE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFDEF_RE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def fatal(msg):
    print(f"check_docs: {msg}", file=sys.stderr)
    sys.exit(2)


class Help:
    """Flags per program (and subcommand), from each --help, run once."""

    def __init__(self, root, bin_dir):
        self.root = root
        self.bin_dir = bin_dir
        self.flags = {}  # (program, subcommand or None) -> set of flags
        self.subcommands = {}  # program -> set of subcommand names

    def load(self):
        missing = [b for b in BINARIES if not (self.bin_dir / b).is_file()]
        missing += [f"scripts/{s}" for s in PY_SCRIPTS + SH_SCRIPTS if not (self.root / "scripts" / s).is_file()]
        if missing:
            where = self.bin_dir / missing[0] if not missing[0].startswith("scripts/") else self.root / missing[0]
            fatal(f"{where} is missing (build the binaries with `bash scripts/build.sh`, or give --bin-dir)")
        jobs = {(b, None): [str(self.bin_dir / b), "--help"] for b in BINARIES}
        jobs.update({(s, None): [sys.executable, str(self.root / "scripts" / s), "--help"] for s in PY_SCRIPTS})
        with ThreadPoolExecutor(max_workers=8) as pool:
            texts = dict(zip(jobs, pool.map(self.run, jobs.values())))
            for b in BINARIES:
                self.subcommands[b] = subcommands_of(texts[(b, None)])
            subjobs = {(b, s): [str(self.bin_dir / b), s, "--help"] for b in BINARIES for s in self.subcommands[b]}
            texts.update(zip(subjobs, pool.map(self.run, subjobs.values())))
        for key, text in texts.items():
            self.flags[key] = set(FLAG_RE.findall(text)) | {"--help"}
        for s in SH_SCRIPTS:
            src = (self.root / "scripts" / s).read_text(errors="replace")
            self.flags[(s, None)] = set(re.findall(r"^\s*(--[A-Za-z0-9][\w-]*)\)", src, re.M)) | {"--help"}
            self.subcommands[s] = set()
        for s in PY_SCRIPTS:
            self.subcommands[s] = set()
        self.union = set().union(*self.flags.values())

    def run(self, cmd):
        try:
            # The launchers read ember-worker's settings from EMBER_BIN (default build/bin).
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=self.root,
                               env={**os.environ, "EMBER_BIN": str(self.bin_dir)})
        except (OSError, subprocess.TimeoutExpired) as e:
            fatal(f"`{' '.join(cmd)}` failed: {e}")
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            fatal(f"`{' '.join(cmd)}` exited with status {r.returncode}: {last}")
        return r.stdout + r.stderr

    def has(self, program, sub, flag):
        if flag in self.flags[(program, None)]:
            return True
        return sub is not None and flag in self.flags.get((program, sub), set())


def subcommands_of(text):
    """Subcommand names from a CLI11 help text (its `Subcommands:` section)."""
    subs, inside = set(), False
    for line in text.splitlines():
        if line.strip() == "Subcommands:":
            inside = True
            continue
        if inside:
            m = re.match(r"^\s+([a-z][\w-]*)\s", line + " ")
            if not m:
                break
            subs.add(m.group(1))
    return subs


def tokenize(text, first_line=1, comments=True):
    """Shell-like words of `text` as [(word, line)]: quotes removed, `# comments` dropped
    (when `comments`), backslash-newline continuations joined. Falls back to splitting
    on white space where the quotes do not balance."""
    text = text.replace("\\\n", " \n")
    words = []
    try:
        lex = shlex.shlex(text, posix=True)
        lex.whitespace_split = True
        lex.commenters = "#" if comments else ""
        while True:
            word = lex.get_token()
            if word is None:  # lex.eof in posix mode
                break
            words.append((word, first_line + text.count("\n", 0, lex.instream.tell() - 1)))
    except ValueError:
        body = re.sub(r"(^|\s)#.*", "", text) if comments else text
        words = [(m.group(0).strip("\"'"), first_line + body.count("\n", 0, m.start())) for m in re.finditer(r"\S+", body)]
    return words


def program_of(token):
    name = token.rstrip("/").rsplit("/", 1)[-1]
    name = WRAPPERS.get(name, name)
    if name in BINARIES or name in PY_SCRIPTS or name in SH_SCRIPTS:
        return name
    return None


class Checker:
    def __init__(self, root, help_):
        self.root = root
        self.help = help_
        self.problems = []
        self.links = 0
        self.flags = 0

    def problem(self, path, line, msg):
        self.problems.append((str(path.relative_to(self.root)), line, msg))

    # --- flags -------------------------------------------------------------------
    def check_flag(self, path, line, program, sub, flag):
        self.flags += 1
        if program is None:
            if flag not in self.help.union:
                self.problem(path, line, f"{flag} is not a flag of any Ember program")
        elif not self.help.has(program, sub, flag):
            name = program + (f" {sub}" if sub else "")
            source = f"the options scripts/{program} parses" if program in SH_SCRIPTS else f"`{name} --help`"
            self.problem(path, line, f"{flag} is not a flag of {name} (not in {source})")

    def check_command(self, path, words):
        """words: [(token, line)] of one command line; checks the flags that follow each
        Ember program on it."""
        program, sub, prev = None, None, None
        for i, (tok, line) in enumerate(words):
            if tok in SEPARATORS:
                program, sub, prev = None, None, None
                continue
            ends = tok.endswith(";") and tok != ";"
            tok = tok.rstrip(";") if ends else tok
            found = program_of(tok)
            if found:
                program, sub = found, None
                nxt = words[i + 1][0] if i + 1 < len(words) else ""
                if nxt in self.help.subcommands.get(found, ()):
                    sub = nxt
            elif program is not None:
                if tok == "--":
                    if program in FORWARD_TO_WORKER:
                        program, sub = "ember-worker", None
                    else:
                        program = None
                elif sub is None and tok in self.help.subcommands.get(program, ()):
                    sub = tok  # e.g. ember-data --log-level info stats DIR
                elif (program, prev) in PS_ARGS:
                    for inner, _ in tokenize(tok, comments=False):
                        m = TOKEN_FLAG_RE.match(inner)
                        if m:
                            self.check_flag(path, line, "ember-ps", None, m.group(1).split("=")[0])
                else:
                    m = TOKEN_FLAG_RE.match(tok)
                    if m:
                        self.check_flag(path, line, program, sub, m.group(1))
            prev = tok
            if ends:
                program, sub, prev = None, None, None

    def check_span(self, path, words):
        if not words:
            return
        if any(program_of(t) for t, _ in words):
            self.check_command(path, words)
            return
        first = words[0][0].lstrip("[(")
        if not first.startswith("--"):
            return  # another program's command, or not a command at all
        for tok, line in words:
            for inner in [tok] + ([w for w, _ in tokenize(tok, comments=False)] if " " in tok else []):
                m = TOKEN_FLAG_RE.match(inner)
                if m:
                    self.check_flag(path, line, None, None, m.group(1))

    # --- links -------------------------------------------------------------------
    def check_links(self, path, text, first_line):
        for m in list(LINK_RE.finditer(text)) + list(REFDEF_RE.finditer(text)):
            target = m.group(1).strip("<>")
            line = first_line + text.count("\n", 0, m.start())
            if not target or target.startswith("#") or SCHEME_RE.match(target):
                continue
            self.links += 1
            rel = unquote(target.split("#", 1)[0].split("?", 1)[0])
            resolved = (self.root / rel.lstrip("/")) if rel.startswith("/") else (path.parent / rel)
            if not resolved.exists():
                self.problem(path, line, f"broken link: {target} ({os.path.relpath(resolved, self.root)} does not exist)")

    # --- one file ----------------------------------------------------------------
    def check_file(self, path):
        lines = path.read_text(errors="replace").splitlines()
        fence, command, block, block_start, command_start = None, [], [], 0, 0

        def flush_block():
            if not block:
                return
            text = "\n".join(block)
            # Inline code spans: flags; then links in the text without the spans.
            for m in SPAN_RE.finditer(text):
                start_line = block_start + text.count("\n", 0, m.start(2))
                self.check_span(path, tokenize(m.group(2), start_line, comments=False))
            blanked = SPAN_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
            self.check_links(path, blanked, block_start)
            block.clear()

        for n, raw in enumerate(lines, 1):
            if fence is None:
                m = FENCE_RE.match(raw)
                if m:
                    flush_block()
                    fence = m.group(1)
                    continue
                if raw.strip():
                    if not block:
                        block_start = n
                    block.append(raw)
                else:
                    flush_block()
                continue
            if raw.strip().startswith(fence[0] * len(fence)) and not raw.strip().strip(fence[0]):
                if command:
                    self.check_command(path, tokenize("\n".join(command), command_start))
                fence, command = None, []
                continue
            if not command:
                command_start = n
            command.append(raw)
            if not raw.rstrip().endswith("\\"):
                self.check_command(path, tokenize("\n".join(command), command_start))
                command = []
        flush_block()
        if fence is not None:
            self.problem(path, len(lines), f"code block opened with {fence} is never closed")


def main():
    default_root = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description="Check links and program flags in Ember's Markdown docs.")
    p.add_argument("--root", type=Path, default=default_root, help="repository root (default: %(default)s)")
    p.add_argument("--bin-dir", type=Path, help="where the Ember binaries are (default: ROOT/build/bin)")
    a = p.parse_args()
    root = a.root.resolve()
    bin_dir = (a.bin_dir or root / "build" / "bin").resolve()
    help_ = Help(root, bin_dir)
    help_.load()
    checker = Checker(root, help_)
    files = [root / "README.md", root / "CONTRIBUTING.md"] + sorted((root / "docs").glob("*.md"))
    checked = 0
    for f in files:
        if not f.is_file():
            checker.problems.append((str(f.relative_to(root)), 1, "file missing"))
            continue
        checker.check_file(f)
        checked += 1
    order = {str(f.relative_to(root)): i for i, f in enumerate(files)}
    for name, line, msg in sorted(checker.problems, key=lambda p: (order.get(p[0], 0), p[1])):
        print(f"{name}:{line}: {msg}")
    if checker.problems:
        print(f"check_docs: {len(checker.problems)} problem(s) in {checked} files", file=sys.stderr)
        return 1
    print(f"check_docs: {checked} files, {checker.links} relative links and {checker.flags} flags checked: all fine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
