#!/usr/bin/env python3
"""Runs the examples in README.md and docs/ that are marked runnable, as a reader would.

A fenced block is runnable when the line before its fence is an HTML comment (invisible on
GitHub and in the site):

    <!-- runnable -->            the block must exit 0
    <!-- runnable exit=3 -->     the block must exit 3 (a budget that cannot be met, …)
    <!-- output -->              the next fenced block is the previous runnable block's output

Shell blocks (sh, bash, console) run with `bash -eo pipefail` in one scratch folder per
document, in the document's order, so a guide's later commands see its earlier outputs. The
scratch folder holds links to the repository's top-level entries (models/, data/, scripts/, …)
and `build` links to the build tree under test, so `build/memc compile models/vit_tiny.onnx`
runs as written and what a guide writes stays in the scratch folder. Python blocks run in one
interpreter per document (`--python`, a venv with memc installed), each block in the namespace
the earlier ones left.

An output block is checked line by line against what its command printed: every line of the
block must appear, in order (other printed lines may come between), with runs of whitespace
equal and every number matching any number (timings, losses and accuracies differ from machine
to machine; the words do not). A line `...` skips freely.

    run_examples.py --repo SRC --build BUILD --lang sh [--python PY] [FILE.md ...]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MARK = re.compile(r"^\s*<!--\s*(runnable|output)(?:\s+exit=(\d+))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SHELL = {"sh", "bash", "shell", "console"}
NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
BLOCK_TIMEOUT_S = 600


class Block:
    def __init__(self, path, line, kind, lang, text, exit_code):
        self.path, self.line, self.kind, self.lang = path, line, kind, lang
        self.text, self.exit_code = text, exit_code
        self.output = None  # the output block that follows a runnable one

    def where(self):
        return f"{self.path}:{self.line}"


def parse(path):
    """The marked blocks of one markdown file, outputs attached to their runnable block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, pending, i = [], None, 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            pending = (m.group(1), int(m.group(2) or 0), i + 1)
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            indent, fence, lang = f.group(1), f.group(2), f.group(3).lower()
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            if j == len(lines):
                sys.exit(f"{path}:{i + 1}: a code fence is not closed")
            if pending:
                kind, code, mark_line = pending
                if mark_line != i:
                    sys.exit(f"{path}:{mark_line}: the <!-- {kind} --> mark must be the line just before a fence")
                b = Block(path, i + 1, kind, lang, "\n".join(body) + "\n", code)
                if kind == "output":
                    if not blocks or blocks[-1].kind != "runnable" or blocks[-1].output:
                        sys.exit(f"{b.where()}: an output block must follow a runnable block")
                    blocks[-1].output = b
                else:
                    blocks.append(b)
            pending = None
            i = j + 1
            continue
        if pending and lines[i].strip():
            sys.exit(f"{path}:{pending[2]}: the <!-- {pending[0]} --> mark must be the line just before a fence")
        i += 1
    return blocks


def line_pattern(expected):
    """A regex for one expected output line: numbers match numbers, whitespace runs match runs."""
    parts, pos = [], 0
    for m in re.finditer(NUMBER, expected):
        parts.append(re.escape(expected[pos:m.start()]))
        parts.append(NUMBER)
        pos = m.end()
    parts.append(re.escape(expected[pos:]))
    pattern = "".join(parts)
    pattern = re.sub(r"(\\\s)+|\s+", r"\\s+", pattern)
    return re.compile(r"^\s*" + pattern + r"\s*$")


def check_output(block, printed):
    """None when every line of the block's output example appears in `printed`, else the first miss."""
    actual = [l for l in re.split(r"[\r\n]", printed) if l.strip()]
    pos = 0
    for want in block.output.text.split("\n"):
        if not want.strip() or want.strip() in ("...", "…"):
            continue
        pat = line_pattern(want)
        while pos < len(actual) and not pat.match(actual[pos]):
            pos += 1
        if pos == len(actual):
            return want
        pos += 1
    return None


def scratch_folder(repo, build):
    d = tempfile.mkdtemp(prefix="memc-doc-")
    for name in os.listdir(repo):
        if name in (".git", "build") or name.startswith("build-"):
            continue
        os.symlink(os.path.join(repo, name), os.path.join(d, name))
    os.symlink(build, os.path.join(d, "build"))
    return d


def environment(build):
    env = dict(os.environ)
    # mpirun as root and on fewer cores than ranks, as the guides' readers run it on a laptop.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1")
    return env


def run_shell(block, cwd, env):
    t = time.time()
    p = subprocess.run(["bash", "-eo", "pipefail", "-c", block.text], cwd=cwd, env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S)
    return p.returncode, p.stdout, time.time() - t


# Runs a document's Python blocks in one namespace; each block's output is framed by a line of
# its own so that it can be checked against the block's output example.
DRIVER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for i, text in enumerate(blocks):
    print(f"@@memc-doc-block {i}@@", flush=True)
    try:
        exec(compile(text, f"<block {i}>", "exec"), ns)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        print(f"@@memc-doc-failed {i}@@", flush=True)
        sys.exit(1)
    sys.stdout.flush(); sys.stderr.flush()
print("@@memc-doc-end@@", flush=True)
"""


def run_python(blocks, python, cwd, env):
    spec = os.path.join(cwd, ".memc-doc-blocks.json")
    with open(spec, "w") as f:
        json.dump([b.text for b in blocks], f)
    driver = os.path.join(cwd, ".memc-doc-driver.py")
    with open(driver, "w") as f:
        f.write(DRIVER)
    t = time.time()
    p = subprocess.run([python, driver, spec], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S * max(1, len(blocks)))
    outputs = re.split(r"^@@memc-doc-block \d+@@\n", p.stdout, flags=re.M)[1:]
    return p.returncode, outputs, p.stdout, time.time() - t


def markdown_files(repo):
    files = [os.path.join(repo, "README.md")]
    for root, _, names in os.walk(os.path.join(repo, "docs")):
        files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".md")]
    return [f for f in files if not os.path.islink(f)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--lang", choices=["sh", "python"], required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    repo, build = os.path.abspath(a.repo), os.path.abspath(a.build)
    files = [os.path.abspath(f) for f in a.files] or markdown_files(repo)
    env = environment(build)
    failures, ran = [], 0
    for path in files:
        rel = os.path.relpath(path, repo)
        blocks = [b for b in parse(path) if (b.lang in SHELL) == (a.lang == "sh") and
                  (a.lang == "sh" or b.lang in ("python", "py"))]
        for b in blocks:
            b.path = rel
        if not blocks:
            continue
        cwd = scratch_folder(repo, build)
        failed_before = len(failures)
        if a.lang == "sh":
            for b in blocks:
                code, out, secs = run_shell(b, cwd, env)
                ran += 1
                print(f"{b.where()}: exit {code} in {secs:.1f} s")
                if code != b.exit_code:
                    failures.append(f"{b.where()}: exited {code}, the guide says {b.exit_code}\n{out[-3000:]}")
                    break  # the document's later blocks build on this one
                miss = b.output and check_output(b, out)
                if miss:
                    failures.append(f"{b.where()}: the output shown at {b.output.where()} has the line\n  {miss}\n"
                                    f"which the command did not print; it printed:\n{out[-3000:]}")
        else:
            code, outputs, out, secs = run_python(blocks, a.python, cwd, env)
            ran += len(blocks)
            print(f"{rel}: {len(blocks)} Python blocks, exit {code} in {secs:.1f} s")
            if code != 0:
                failed = re.search(r"@@memc-doc-failed (\d+)@@", out)
                where = blocks[int(failed.group(1))].where() if failed else rel
                failures.append(f"{where}: the block raised\n{out[-3000:]}")
            else:
                for b, printed in zip(blocks, outputs):
                    miss = b.output and check_output(b, printed.replace("@@memc-doc-end@@", ""))
                    if miss:
                        failures.append(f"{b.where()}: the output shown at {b.output.where()} has the line\n"
                                        f"  {miss}\nwhich the block did not print; it printed:\n{printed[-3000:]}")
        if len(failures) == failed_before:
            shutil.rmtree(cwd, ignore_errors=True)
        else:  # what the failing blocks wrote stays for a look
            failures[-1] += f"\n(the blocks ran in {cwd}, kept)"
    print(f"{ran} runnable {a.lang} blocks, {len(failures)} failed")
    for f in failures:
        print("FAILED " + f, file=sys.stderr)
    if ran == 0:
        print(f"no runnable {a.lang} block found in {len(files)} files", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
