"""The Python examples of README.md and docs/ that are marked runnable run as written, in this
venv (memc installed, torch beside it), printing what the guides show (tests/docs/run_examples.py
says how blocks are marked and checked; the shell examples are ctest's docs.examples)."""
import os
import subprocess
import sys

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_python_examples_in_the_docs_run_as_written():
    build = os.environ.get("MEMC_TEST_BUILD", os.getcwd())
    p = subprocess.run([sys.executable, os.path.join(SRC, "tests", "docs", "run_examples.py"), "--repo", SRC,
                        "--build", build, "--lang", "python", "--python", sys.executable],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-6000:]
