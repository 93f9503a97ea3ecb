#!/usr/bin/env python3
"""Every relative link in the repository's markdown resolves: the file or folder exists, and a
`#fragment` names a heading of the target (GitHub's and mkdocs' slugs: lower case, punctuation
dropped, spaces as hyphens). Links inside code spans and fenced blocks are text, not links.
Web addresses are not fetched (the tests run offline).

    check_links.py SRC
"""
import os
import re
import sys

SKIP_DIRS = {".git", "third_party", "node_modules"}
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\".*\")?\s*$")
HTML = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"")


def prose_lines(text):
    """(line number, line) outside fenced blocks, with code spans blanked."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda s: " " * len(s.group(0)), line)


def slug(heading):
    s = re.sub(r"<[^>]+>", "", heading).strip().lower()
    s = re.sub(r"[`*_~]", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        names, seen = set(), {}
        for _, line in prose_lines(open(path, encoding="utf-8").read()):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                k = seen.get(base, 0)
                seen[base] = k + 1
                names.add(base if k == 0 else f"{base}-{k}")
            for a in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
                names.add(a)
        cache[path] = names
    return cache[path]


def links(path):
    text = open(path, encoding="utf-8").read()
    for n, line in prose_lines(text):
        for rx in (INLINE, HTML):
            for m in rx.finditer(line):
                yield n, m.group(1)
        m = REFERENCE.match(line)
        if m:
            yield n, m.group(1)


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = []
    for root, dirs, names in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        files += [os.path.join(root, n) for n in names if n.endswith(".md")]
    bad, count = [], 0
    for path in sorted(files):
        if os.path.islink(path):
            continue  # read through its target, with the target's links
        rel = os.path.relpath(path, repo)
        for n, target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            count += 1
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                bad.append(f"{rel}:{n}: link to {target}: no such file")
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                bad.append(f"{rel}:{n}: link to {target}: {os.path.relpath(dest, repo)} has no heading #{frag}")
    print(f"{count} relative links in {len(files)} markdown files, {len(bad)} broken")
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
