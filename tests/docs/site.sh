#!/usr/bin/env bash
# ctest docs.site: builds the documentation site (mkdocs.yml: docs/ and the Python API reference
# from python/memc's docstrings, read statically by mkdocstrings, without importing memc or
# torch) with --strict, so a broken link, a page left out of the nav or a docstring griffe cannot
# read fails. mkdocs comes from PyPI into a venv under the build tree, made once per pin set.
#   bash tests/docs/site.sh SRC BUILD
set -euo pipefail
SRC=$(cd "$1" && pwd)
BUILD=$(cd "$2" && pwd)
venv=$BUILD/docs-venv
pins="mkdocs==1.6.1 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11 griffelib==2.4.1 mkdocs-autorefs==1.4.5 Markdown==3.11.3"
if [ "$(cat "$venv/pins" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip -q --disable-pip-version-check install $pins
  echo "$pins" > "$venv/pins"
fi
cd "$SRC"
exec "$venv/bin/mkdocs" build --strict -f mkdocs.yml -d "$BUILD/site"
