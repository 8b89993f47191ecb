#!/usr/bin/env bash
# ctest cmake.installed_package: install attnbench into a temporary prefix,
# build the out-of-tree example plugins (examples/plugin) against the
# installed package with find_package(attnbench), then load them into the
# installed attn: listed, verified over the standard suite, benchmarked. Also
# the refusals: another ABI version, a library that is not a plugin, a name
# taken twice; broken variants (K read transposed, a wrong lse, patched in
# here, on the test side) must FAIL; a plugin built against ABI version 1
# (tests/plugins/abi_v1) keeps loading and passing.
#   installed_package.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
source_dir=$1 build_dir=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
fail() { echo "FAILED: $*" >&2; exit 1; }
# expect_exit CODE OUTPUT COMMAND...: runs COMMAND with its output in OUTPUT,
# and fails (showing the output's end) unless it exits CODE.
expect_exit() {
  local want=$1 output=$2; shift 2
  local code=0
  "$@" > "$output" 2>&1 || code=$?
  [ "$code" -eq "$want" ] || { tail -20 "$output"; fail "$(basename "$1") ${2:-} exited $code, not $want ($output)"; }
}

cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log"
attn=$prefix/bin/attn
[ -x "$attn" ] || fail "cmake --install put no attn in $prefix/bin"
for f in include/attnbench/plugin.h include/attnbench/cpp_plugin.hpp include/attnbench/backend.hpp \
         share/doc/attnbench/fixture-format-v1.md share/doc/attnbench/fixture-format-v2.md share/doc/attnbench/fixture-format-v3.md \
         lib/cmake/attnbench/attnbenchConfig.cmake share/attnbench/fixtures/golden/basic; do
  [ -e "$prefix/$f" ] || fail "the install lacks $f"
done

# The SDK stands alone: every installed header compiles on its own, with only
# the installed include folder (and the system's fmt) on the path.
cxx=${CXX:-c++}
headers=0
for h in "$prefix"/include/attnbench/*; do
  name=$(basename "$h")
  case "$name" in
    *.h) printf '#include <attnbench/%s>\n' "$name" > "$work/alone.c"
         ${CC:-cc} -std=c99 -Wall -Werror -fsyntax-only -I"$prefix/include" "$work/alone.c" \
           || fail "attnbench/$name does not compile alone (C)";;
    *.hpp) printf '#include <attnbench/%s>\n' "$name" > "$work/alone.cpp"
           "$cxx" -std=c++20 -Wall -Werror -fsyntax-only -I"$prefix/include" "$work/alone.cpp" \
             || fail "attnbench/$name does not compile alone";;
    *) fail "unexpected file in the installed include/attnbench: $name";;
  esac
  headers=$((headers + 1))
done
[ $headers -ge 8 ] || fail "only $headers headers installed under include/attnbench"
echo "headers: $headers compile alone"

# The plugins, built as a user would: no attnbench warning flags, only the package.
cmake -S "$source_dir/examples/plugin" -B "$work/plugins" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$work/plugins" > "$work/build.log" || { cat "$work/build.log"; fail "build"; }
c_plugin=$work/plugins/libattn_example_c.so cpp_plugin=$work/plugins/libattn_example_cpp.so

# Listed, from the flag and from ATTN_PLUGINS.
"$attn" list --plugin "$c_plugin" --plugin "$cpp_plugin" > "$work/list.txt"
grep -q '^example-c  *yes' "$work/list.txt" || fail "attn list does not show example-c as available"
grep -q '^example-cpp  *yes' "$work/list.txt" || fail "attn list does not show example-cpp as available"
ATTN_PLUGINS="$c_plugin:$cpp_plugin" "$attn" list | grep -q '^example-cpp' || fail "ATTN_PLUGINS loads nothing"

# Verified over the installed standard suite (the default fixtures of an installed attn).
expect_exit 0 "$work/verify.txt" \
  "$attn" verify --plugin "$c_plugin" --plugin "$cpp_plugin" -b example-c,example-cpp -t smoke -q --json "$work/verify.json"
/usr/bin/python3 - "$work/verify.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["summary"]["per_backend"]
assert c["example-c"]["PASS"] >= 18 and c["example-c"]["FAIL"] == 0, c["example-c"]
assert c["example-cpp"]["PASS"] >= 14 and c["example-cpp"]["FAIL"] == 0, c["example-cpp"]
reasons = [r["reason"] for r in d["results"] if r["backend"] == "example-cpp" and r["verdict"] == "SKIP" and r.get("check", "golden") == "golden"]
assert any("float64" in r for r in reasons), reasons  # not among its declared dtypes, with the reason
# ABI version 5: example-c declares batch invariance and the layout relation
# bitwise, and is held to both (a row of its own each, never a golden row).
mine = [r for r in d["results"] if r["backend"] == "example-c"]
inv = [r for r in mine if r.get("check") == "batch invariance" and r["verdict"] != "SKIP"]
assert inv and all(r["verdict"] == "PASS" and r["reason"].startswith("INVARIANT") for r in inv), inv
lay = [r for r in mine if r.get("check") == "relation layout" and r["verdict"] != "SKIP"]
assert lay and all(r["reason"].startswith("EXACT") for r in lay), lay
print("verified:", c)
PY
grep -A1 '^example-c ' "$work/list.txt" | grep -q 'batch-invariant; bitwise layout' || \
  fail "attn list does not show example-c's ABI 5 declarations: $(grep -A1 '^example-c ' "$work/list.txt")"

# ABI version 2 carries what each backend declares: its version 2 features run
# (example-c: window, softcap, ALiBi, sinks; example-cpp: window, softcap) and
# pass, with lse judged; the rest SKIP with the feature named. (The checks
# without a golden reach a plugin through the ABI as any run does: the smoke
# run above proves them; here and in the backward's run, the golden rows.)
expect_exit 0 "$work/v2.txt" "$attn" verify --plugin "$c_plugin" --plugin "$cpp_plugin" -b example-c,example-cpp \
  -t window,softcap,alibi,sinks -q --skip-check invariance,relations --json "$work/v2.json"
/usr/bin/python3 - "$work/v2.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
res = [r for r in d["results"] if r.get("check", "golden") == "golden"]  # the golden comparison's rows
key = {"softcap": "softcap=", "window": ",wl=", "alibi": ",alibi", "sinks": ",sinks"}
def verdicts(backend, tag):
    return [r["verdict"] for r in res if r["backend"] == backend and key[tag] in r["problem"]]
for tag in ("softcap", "window"):
    for b in ("example-c", "example-cpp"):
        v = verdicts(b, tag)
        assert v and "PASS" in v and "FAIL" not in v, (b, tag, v)
for tag in ("alibi", "sinks"):
    v = verdicts("example-c", tag)
    assert v and "PASS" in v and "FAIL" not in v, ("example-c", tag, v)
skips = [r["reason"] for r in res if r["backend"] == "example-cpp" and r["verdict"] == "SKIP"]
assert any("alibi" in r.lower() or "sinks" in r.lower() for r in skips), skips
for b in ("example-c", "example-cpp"):
    judged = [r for r in res if r["backend"] == b and r["verdict"] == "PASS" and any(t["name"] == "lse" for t in r["tensors"])]
    assert judged, (b, "no PASS judged lse")
print("version 2 features through plugins:", d["summary"]["per_backend"])
PY

# ABI version 3 carries the backward pass: example-cpp's gradients (the
# textbook backward in double) pass every backward case it declares the
# features of; example-c, which has none, is SKIP there with the reason.
expect_exit 0 "$work/v3.txt" "$attn" verify --plugin "$c_plugin" --plugin "$cpp_plugin" -b example-c,example-cpp \
  -t backward --direction backward -q --skip-check invariance,relations --json "$work/v3.json"
/usr/bin/python3 - "$work/v3.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
res = [r for r in d["results"] if r.get("check", "golden") == "golden"]  # the golden comparison's rows
cpp = [r for r in res if r["backend"] == "example-cpp"]
assert sum(r["verdict"] == "PASS" for r in cpp) >= 10 and not any(r["verdict"] == "FAIL" for r in cpp), \
    [(r["fixture"], r["verdict"], r["reason"]) for r in cpp]
# A layer's rows score its own gradients (the projections' around the plugin's attention backward).
assert all(r["direction"] == "backward" and ({"dx_q", "dw_q", "dw_o"} if r["fixture"].startswith("layer_backward/") else {"dq", "dk", "dv"})
           <= {t["name"] for t in r["tensors"]} for r in cpp if r["verdict"] == "PASS")
assert any(r["fixture"].startswith("layer_backward/") for r in cpp if r["verdict"] == "PASS")
# example-c has no attention backward (SKIP), but a layer of its own (ABI 6),
# whose backward is its own.
c = [r for r in res if r["backend"] == "example-c" and not r["fixture"].startswith("layer_backward/")]
assert c and all(r["verdict"] == "SKIP" for r in c), c
assert any("does not implement the backward pass" in r["reason"] for r in c), c
print("version 3 backward through plugins:", d["summary"]["per_backend"])
PY

# ABI version 6 carries whole layers: example-c runs its own (projections in
# double around its attention, and the chain rule back): layer cases with
# kdim/vdim and padding, a trainable bias with -inf, and a window, softcap,
# ALiBi and sinks pass forward and backward; patched (on the test side) to
# leave dw_o's gradient transposed, it FAILs naming dw_o.
layers=$prefix/share/attnbench/fixtures/golden/layer_backward
layer_cases="$layers/kdim40_vdim24_padding_q6_k9_bf16.h5 $layers/bias_trainable_b2_s8_f16.h5
             $layers/v2_window_softcap_alibi_sinks_f32.h5"
# shellcheck disable=SC2086
expect_exit 0 "$work/v6.txt" "$attn" verify --plugin "$c_plugin" -b example-c $layer_cases -q --json "$work/v6.json"
/usr/bin/python3 - "$work/v6.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
res = [r for r in d["results"] if r.get("check", "golden") == "golden"]
rows = {(r["fixture"], r["direction"]): r["verdict"] for r in res}
assert len(rows) == 6 and set(rows.values()) == {"PASS"}, rows
backward = [r for r in res if r["direction"] == "backward"]
assert all({"dx_k", "dw_v", "dw_o"} <= {t["name"] for t in r["tensors"]} for r in backward), backward
assert any("dsinks" in {t["name"] for t in r["tensors"]} for r in backward)
print("version 6 layers through a C plugin:", d["summary"]["per_backend"])
PY
sed 's/matmul(s.o, 1, dout, 0, ow, q_rows, l->model_dim, NULL, g->dw_o);/matmul(dout, 1, s.o, 0, l->model_dim, q_rows, ow, NULL, g->dw_o);/' \
  "$source_dir/examples/plugin/example_c.c" > "$work/dw_o_transposed.c"
cmp -s "$source_dir/examples/plugin/example_c.c" "$work/dw_o_transposed.c" && fail "the dw_o patch no longer applies to example_c.c"
"${CC:-cc}" -std=c99 -Wall -Werror -shared -fPIC -O1 -I"$prefix/include" -o "$work/libdwo.so" "$work/dw_o_transposed.c" -lm
expect_exit 1 "$work/v6bad.txt" "$attn" verify --plugin "$work/libdwo.so" -b example-c "$layers/kdim40_vdim24_padding_q6_k9_bf16.h5" -q
grep -q "dw_o" "$work/v6bad.txt" || fail "a layer plugin with dw_o transposed FAILs without naming dw_o: $(tail -5 "$work/v6bad.txt")"

# ABI version 4 carries quantised q, k and v (format version 4): example-cpp
# declares every encoding and reads the codes through the SDK's QuantView, so
# it passes every quantised case of the features it has; example-c declares
# none and SKIPs them, naming the encodings.
expect_exit 0 "$work/v4.txt" "$attn" verify --plugin "$c_plugin" --plugin "$cpp_plugin" -b example-c,example-cpp \
  -t quantised -q --json "$work/v4.json"
/usr/bin/python3 - "$work/v4.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
res = [r for r in d["results"] if r.get("check", "golden") == "golden"]  # the golden comparison's rows
cpp = [r for r in res if r["backend"] == "example-cpp"]
passed = {r["fixture"] for r in cpp if r["verdict"] == "PASS"}
assert len(passed) >= 10 and not any(r["verdict"] == "FAIL" for r in cpp), [(r["fixture"], r["verdict"], r["reason"]) for r in cpp]
for enc in ("e4m3", "e5m2", "int8", "uint8", "int4", "q8_0", "q4_0"):
    assert any(enc in f for f in passed), (enc, sorted(passed))
c = [r for r in res if r["backend"] == "example-c"]
assert c and all(r["verdict"] == "SKIP" for r in c), c
for enc in ("float8_e4m3fn", "float8_e5m2", "int8", "q8_0", "q4_0"):
    assert any(enc + " inputs" in r["reason"] for r in c), (enc, [r["reason"] for r in c])
print("version 4 quantised cases through plugins:", d["summary"]["per_backend"])
PY

# A plugin built against ABI version 5 keeps loading (tests/plugins/abi_v5 is
# that header, frozen): it has no layer of its own, so attn computes a layer's
# projections around its attention.
"${CC:-cc}" -std=c99 -Wall -Werror -shared -fPIC -O1 -I"$source_dir/tests/plugins/abi_v5" -o "$work/libv5.so" \
  "$source_dir/examples/plugin/example_c.c" -lm
expect_exit 0 "$work/v5plugin.txt" "$attn" verify --plugin "$work/libv5.so" -b example-c "$layers/self_b2_s10_f32.h5" \
  --json "$work/v5plugin.json"
/usr/bin/python3 - "$work/v5plugin.json" <<'PY'
import json, sys
res = [r for r in json.load(open(sys.argv[1]))["results"] if r.get("check", "golden") == "golden"]
verdicts = {r["direction"]: r["verdict"] for r in res}
assert verdicts == {"forward": "PASS", "backward": "SKIP"}, res  # no attention backward, no layer of its own
print("ABI version 5 plugin: a layer's forward around its attention, its backward SKIP")
PY

# A plugin built against ABI version 4 keeps loading (tests/plugins/abi_v4 is
# that header, frozen): it declares no batch invariance, so it is reported,
# not held to it.
"${CC:-cc}" -std=c99 -Wall -Werror -shared -fPIC -O1 -I"$source_dir/tests/plugins/abi_v4" -o "$work/libv4.so" \
  "$source_dir/examples/plugin/example_c.c" -lm
"$attn" list --plugin "$work/libv4.so" > "$work/v4list.txt" || fail "an ABI version 4 plugin does not load"
grep -A1 '^example-c ' "$work/v4list.txt" | grep -q 'batch-invariant' && fail "an ABI version 4 plugin declares batch invariance"
expect_exit 0 "$work/v4plugin.txt" "$attn" verify --plugin "$work/libv4.so" -b example-c \
  "$prefix/share/attnbench/fixtures/golden/backward/softcap_f32.h5" --json "$work/v4plugin.json"

# A plugin built against ABI version 3 keeps loading (tests/plugins/abi_v3 is
# that header, frozen): its forward passes, quantised cases SKIP.
"${CC:-cc}" -std=c99 -Wall -Werror -shared -fPIC -O1 -I"$source_dir/tests/plugins/abi_v3" -o "$work/libv3.so" \
  "$source_dir/examples/plugin/example_c.c" -lm
expect_exit 0 "$work/v3plugin.txt" "$attn" verify --plugin "$work/libv3.so" -b example-c \
  "$prefix/share/attnbench/fixtures/golden/backward/softcap_f32.h5" \
  "$prefix/share/attnbench/fixtures/golden/quantised/q8_0_kv_decode_gqa_f32.h5" --json "$work/v3plugin.json"
/usr/bin/python3 - "$work/v3plugin.json" <<'PY'
import json, sys
res = [r for r in json.load(open(sys.argv[1]))["results"] if r.get("check", "golden") == "golden"]
forward = {r["fixture"]: r["verdict"] for r in res if r["direction"] == "forward"}
assert forward == {"backward/softcap_f32": "PASS", "quantised/q8_0_kv_decode_gqa_f32": "SKIP"}, res
print("ABI version 3 plugin: forward PASS, quantised SKIP")
PY

# A plugin built against ABI version 2 keeps loading (tests/plugins/abi_v2 is
# that header, frozen): its forward passes, its gradient cases SKIP.
"${CC:-cc}" -std=c99 -Wall -Werror -shared -fPIC -O1 -I"$source_dir/tests/plugins/abi_v2" -o "$work/libv2.so" \
  "$source_dir/examples/plugin/example_c.c" -lm
expect_exit 0 "$work/v2plugin.txt" "$attn" verify --plugin "$work/libv2.so" -b example-c \
  "$prefix/share/attnbench/fixtures/golden/backward/softcap_f32.h5" --json "$work/v2plugin.json"
/usr/bin/python3 - "$work/v2plugin.json" <<'PY'
import json, sys
res = [r for r in json.load(open(sys.argv[1]))["results"] if r.get("check", "golden") == "golden"]
assert [r["verdict"] for r in res if r["direction"] == "forward"] == ["PASS"], res
assert [r["verdict"] for r in res if r["direction"] == "backward"] == ["SKIP"], res
print("ABI version 2 plugin: forward PASS, backward SKIP")
PY

# A plugin built against ABI version 1 keeps loading: example_c.c compiled
# against the version 1 header (tests/plugins/abi_v1), renamed and given a
# second backend without lse (so attn must step through backends[] by the
# version 1 size): every dtype, lse per backend, version 2 cases SKIP.
/usr/bin/python3 - "$source_dir/examples/plugin/example_c.c" "$work/v1.c" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
entry = re.search(r"static const attn_backend backends\[\] = \{(\{.*?\n\})\};", s, re.S)
assert entry, "no backends[] table in example_c.c"
first = entry.group(1).replace('"example-c"', '"example-c-v1"')
second = first.replace('"example-c-v1"', '"example-c-v1-nolse"').replace(".has_lse = 1", ".has_lse = 0")
assert second != first and ".has_lse = 0" in second
s = s.replace(entry.group(0), "static const attn_backend backends[] = {" + first + ", " + second + "};")
assert "sizeof(attn_backend), 1, backends" in s
s = s.replace("sizeof(attn_backend), 1, backends", "sizeof(attn_backend), 2, backends")
open(sys.argv[2], "w").write(s)
PY
"${CC:-cc}" -std=c99 -Wall -Werror -shared -fPIC -O1 -I"$source_dir/tests/plugins/abi_v1" -o "$work/libv1.so" "$work/v1.c" -lm
expect_exit 0 "$work/v1.txt" \
  "$attn" verify --plugin "$work/libv1.so" -b example-c-v1,example-c-v1-nolse -t smoke,softcap -q --json "$work/v1.json"
/usr/bin/python3 - "$work/v1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["summary"]["per_backend"]
for b in ("example-c-v1", "example-c-v1-nolse"):
    assert c[b]["PASS"] >= 18 and c[b]["FAIL"] == 0, (b, c[b])
res = [r for r in d["results"] if r.get("check", "golden") == "golden"]  # the golden comparison's rows
def has_lse(r):
    return any(t["name"] == "lse" for t in r["tensors"])
assert any(r["backend"] == "example-c-v1" and has_lse(r) for r in res if r["verdict"] == "PASS"), "v1 lse not judged"
assert not any(r["backend"] == "example-c-v1-nolse" and has_lse(r) for r in res), "lse judged for a backend without it"
skips = [r["reason"] for r in res if r["verdict"] == "SKIP" and "softcap=" in r["problem"]]
assert skips and all("softcap" in s for s in skips), skips
print("ABI version 1 plugin:", c)
PY

# Benchmarked: one problem of the quick preset, timed for real.
"$attn" bench --plugin "$c_plugin" -b example-c --preset quick --no-peak --benchmark_filter='sq=1,sk=65536' \
  --benchmark_repetitions=1 --out "$work/bench.json" > "$work/bench.txt" 2>&1 || fail "attn bench of the plugin"
/usr/bin/python3 - "$work/bench.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["benchmarks"]
ran = [x for x in b if x["name"].startswith("example-c/") and not x.get("error_occurred") and x["real_time"] > 0]
assert ran, b
print("benchmarked:", ran[0]["name"], ran[0]["real_time"], ran[0]["time_unit"])
PY

# Refusals, each exit 2 with the reason.
expect_refusal() {  # expect_refusal PATTERN COMMAND...
  local pattern=$1; shift
  expect_exit 2 "$work/refusal.txt" "$@"
  grep -q -- "$pattern" "$work/refusal.txt" || { cat "$work/refusal.txt"; fail "no '$pattern' in the refusal"; }
}
cc=${CC:-cc}
sed 's/return ATTN_PLUGIN_ABI_VERSION; }/return 99; }/' "$source_dir/examples/plugin/example_c.c" > "$work/abi99.c"
grep -q 'return 99; }' "$work/abi99.c" || fail "the ABI patch did not apply"
"$cc" -shared -fPIC -O1 -I"$prefix/include" -o "$work/libabi99.so" "$work/abi99.c" -lm
expect_refusal "built for plugin ABI version 99, but this attn speaks versions 1 to 6" "$attn" list --plugin "$work/libabi99.so"
echo 'int not_a_plugin(void) { return 0; }' > "$work/plain.c"
"$cc" -shared -fPIC -o "$work/libplain.so" "$work/plain.c"
expect_refusal "not an attnbench plugin" "$attn" verify --plugin "$work/libplain.so"
expect_refusal "cannot load it" "$attn" list --plugin "$work/missing.so"
expect_refusal "is taken by plugin" "$attn" list --plugin "$c_plugin" --plugin "$c_plugin"

# A broken variant must FAIL: K read with its head-dim and sequence strides swapped.
sed 's/d \* ks\[3\]/d * ks[2]/; s/j \* ks\[2\]/j * ks[3]/' "$source_dir/examples/plugin/example_c.c" > "$work/broken.c"
cmp -s "$work/broken.c" "$source_dir/examples/plugin/example_c.c" && fail "the broken patch did not apply"
"$cc" -shared -fPIC -O1 -I"$prefix/include" -o "$work/libbroken.so" "$work/broken.c" -lm
# One witness each: a FAIL on it is a FAIL of every run that holds it.
witness="$prefix/share/attnbench/fixtures/golden/mha/b2_h4_q17_k33_d64_f32.h5"
expect_exit 1 "$work/broken.txt" "$attn" verify --plugin "$work/libbroken.so" -b example-c "$witness" -q
grep -q "FAIL" "$work/broken.txt" || fail "the transposed-K plugin has no FAIL"
# A wrong lse, a wrong backward and a dropped descale must FAIL through the
# C ABI: the C++ plugin patched to write lse + 1, dV from P before its
# division by the sum, and quantised rows without their descale.
sed 's/total > 0 ? top + std::log(total)/total > 0 ? top + std::log(total) + 1.0/; s/+= pj \* in(io_.dout/+= weight_[static_cast<std::size_t>(j)] * in(io_.dout/; s/for (double\& x : row) x \*= descale;/(void)descale;/' \
  "$source_dir/examples/plugin/example_cpp.cpp" > "$work/wrong_lse.cpp"
[ "$(diff "$work/wrong_lse.cpp" "$source_dir/examples/plugin/example_cpp.cpp" | grep -c '^<')" -eq 3 ] \
  || fail "the lse, dV and descale patches did not all apply"
mkdir -p "$work/wrong_lse"
cp "$source_dir/examples/plugin/CMakeLists.txt" "$source_dir/examples/plugin/example_c.c" "$work/wrong_lse/"
cp "$work/wrong_lse.cpp" "$work/wrong_lse/example_cpp.cpp"
cmake -S "$work/wrong_lse" -B "$work/wrong_lse/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$work/wrong_lse.log" && cmake --build "$work/wrong_lse/build" --target attn_example_cpp >> "$work/wrong_lse.log" \
  || { cat "$work/wrong_lse.log"; fail "build of the wrong-lse plugin"; }
expect_exit 1 "$work/wrong_lse.txt" "$attn" verify --plugin "$work/wrong_lse/build/libattn_example_cpp.so" -b example-cpp "$witness" -q
grep -q "lse" "$work/wrong_lse.txt" || { cat "$work/wrong_lse.txt"; fail "the wrong-lse FAIL does not name lse"; }
expect_exit 1 "$work/wrong_dv.txt" "$attn" verify --plugin "$work/wrong_lse/build/libattn_example_cpp.so" -b example-cpp \
  "$prefix/share/attnbench/fixtures/golden/backward/basic_q17_k33_f32.h5" --direction backward -q
grep -q "FAIL (dv" "$work/wrong_dv.txt" || { cat "$work/wrong_dv.txt"; fail "the wrong-dV FAIL does not name dv"; }
expect_exit 1 "$work/no_descale.txt" "$attn" verify --plugin "$work/wrong_lse/build/libattn_example_cpp.so" -b example-cpp \
  "$prefix/share/attnbench/fixtures/golden/quantised/e4m3_kv_decode_gqa_bf16.h5" -q
grep -q "descale" "$work/no_descale.txt" || { cat "$work/no_descale.txt"; fail "the dropped-descale FAIL does not name a descale"; }
# The Python package, where this build made one: imported from the prefix, it
# reads the installed fixtures, names the installed attn in a reproduce line,
# and the installed attn finds it for a BACKEND file.
site=$(ls -d "$prefix"/lib/python3*/dist-packages 2>/dev/null | head -1 || true)
if [ -n "$site" ] && [ -e "$site/attnbench/__init__.py" ]; then
  (cd "$work" && PYTHONPATH="$site" /usr/bin/python3 - "$prefix" <<'PY'
import os, sys
import attnbench
prefix = os.path.realpath(sys.argv[1])
assert os.path.realpath(attnbench.default_fixtures()).startswith(prefix), attnbench.default_fixtures()
case = [c for c in attnbench.cases("smoke") if c.name == "mha/b2_h4_q17_k33_d64_f32"][0]
v = attnbench.check("naive", case)
assert v.verdict == "PASS", v.report()
dropped = attnbench.kernel(lambda q, k, v: (q @ k[:, :, :-1].swapaxes(-1, -2)) @ v[:, :, :-1], name="dropped")
v = attnbench.check(dropped, case)
assert v.verdict == "FAIL", v.report()
PY
  ) || fail "the installed Python package"
  cat > "$work/backend_file.py" <<'PY'
import attnbench
BACKEND = attnbench.kernel(lambda q, k, v, *, scale: q[..., :v.shape[-1]] * 0, name="zeros")
PY
  expect_exit 1 "$work/backend_file.txt" "$attn" verify --plugin "$work/backend_file.py" -b zeros -q \
    "$prefix/share/attnbench/fixtures/golden/mha/b2_h4_q17_k33_d64_f32.h5"
  grep -q "zeros" "$work/backend_file.txt" || fail "the BACKEND file's kernel did not run"
fi
echo "installed package: OK"
