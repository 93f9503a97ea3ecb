# No function in passes/, planner/, runtime/ or tools/ is longer than 80 lines, signature to
# closing brace (issue 16; ../shared/STYLE.md): a longer one is split into named steps. Data
# tables are exempt by name below. One line per violation: `file:line: N lines: signature`.
#   bash tests/cli/function_length.sh [MEMC SRC]   (ctest passes the memc binary, unused here, and SRC)
set -uo pipefail
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
cd "$SRC" || exit 1
python3 - passes planner runtime tools <<'PY'
import os, re, sys

LIMIT = 80
EXEMPT = set()  # "file:function" of data tables, each with its reason

def strip(src):
    """Comments and string/char literals removed, newlines kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
        elif src.startswith('/*', i):
            j = src.find('*/', i) + 2
            out.append('\n' * src.count('\n', i, j))
            i = j
        elif src.startswith('R"(', i):
            j = src.find(')"', i) + 2
            out.append('""' + '\n' * src.count('\n', i, j))
            i = j
        elif src[i] in '"\'':
            q, j = src[i], i + 1
            while j < n and src[j] != q:
                j += 2 if src[j] == '\\' else 1
            out.append(q + q)
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return ''.join(out)

def functions(path):
    """(first line, last line, signature) of each outermost function body."""
    text = strip(open(path, encoding='utf-8').read())
    found, stack, line, head, head_line = [], [], 1, '', 1
    for ch in text:
        if ch == '\n':
            line += 1
        if ch == '{':
            t = ' '.join(head.split())
            inside = any(k == 'func' for k, _, _ in stack)
            if inside:
                kind = 'block'
            elif re.match(r'(namespace|extern)\b', t):
                kind = 'ns'
            elif '(' in t and not t.endswith('=') and not re.match(r'(struct|class|enum|union)\b', t):
                kind = 'func'
            else:
                kind = 'type'
            stack.append((kind, head_line if kind == 'func' else line, t))
            head, head_line = '', line
        elif ch == '}':
            if stack:
                kind, first, sig = stack.pop()
                if kind == 'func' and not any(k == 'func' for k, _, _ in stack):
                    found.append((first, line, sig))
            head, head_line = '', line
        elif ch == ';':
            head, head_line = '', line
        else:
            if not head.strip() and not ch.isspace():
                head_line = line
            head += ch
    return found

bad = 0
for folder in sys.argv[1:]:
    for name in sorted(os.listdir(folder)):
        if not name.endswith(('.cc', '.h')):
            continue
        path = os.path.join(folder, name)
        for first, last, sig in functions(path):
            length = last - first + 1
            fn = re.sub(r'\s*\(.*', '', sig).split()[-1] if sig else '?'
            if length > LIMIT and f'{path}:{fn}' not in EXEMPT:
                print(f'{path}:{first}: {length} lines: {sig[:100]}')
                bad += 1
if bad:
    print(f'FAIL: {bad} function(s) over {LIMIT} lines (split them into named steps)')
    sys.exit(1)
print(f'ok: no function over {LIMIT} lines in {", ".join(sys.argv[1:])}')
PY
