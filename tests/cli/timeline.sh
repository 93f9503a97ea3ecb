#!/usr/bin/env bash
# memc inspect PLAN --timeline writes one self-contained page that headless Chromium renders:
# the DOM has the stacked chart with the peak marked and one hoverable rectangle per buffer.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
command -v chromium >/dev/null || { fail "chromium not installed (scripts/setup.sh installs it)"; finish; }

$MEMC compile models/vit_tiny.onnx --batch 32 --json -o "$TMP/v.plan" >"$TMP/compile.json" 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"
$MEMC inspect "$TMP/v.plan" --timeline "$TMP/t.html" >/dev/null 2>"$TMP/err" || fail "timeline: $(cat "$TMP/err")"
grep -qE '<script|https?://' "$TMP/t.html" && fail "the page loads scripts or network resources"
timeout 120 chromium --headless --no-sandbox --disable-gpu --dump-dom "file://$TMP/t.html" >"$TMP/dom.html" 2>/dev/null || fail "chromium could not render the page"
python3 - "$TMP/dom.html" "$TMP/compile.json" <<'PY' && pass "timeline DOM" || fail "timeline DOM"
import html.parser, json, sys
class P(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.ids = set(); self.buffers = 0; self.roles = set(); self.titles = 0; self.summary = ""
        self.in_summary = False
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a: self.ids.add(a["id"])
        if tag == "rect" and a.get("class") == "buffer": self.buffers += 1
        if tag == "polygon" and a.get("class") == "role": self.roles.add(a.get("data-role"))
        if tag == "title": self.titles += 1
        if a.get("id") == "summary": self.in_summary = True
    def handle_endtag(self, tag):
        if tag == "p": self.in_summary = False
    def handle_data(self, d):
        if self.in_summary: self.summary += d
p = P(); p.feed(open(sys.argv[1]).read())
plan = json.load(open(sys.argv[2]))
assert {"stacked", "arena", "peak", "peak-step", "summary"} <= p.ids, p.ids
assert {"params", "optimizer_state", "activations", "grads"} <= p.roles, p.roles
assert p.buffers > 100, p.buffers
assert p.titles >= p.buffers, (p.titles, p.buffers)        # every buffer identifiable on hover
assert str(plan["predicted_peak_bytes"]) in p.summary, (plan["predicted_peak_bytes"], p.summary)
print("buffers", p.buffers, "roles", sorted(p.roles))
PY
expect_error 2 "needs a plan" -- $MEMC inspect models/vit_tiny.onnx --timeline "$TMP/x.html"
finish
