#!/usr/bin/env bash
# ctest cmake.installed_package: install attnbench into a temporary prefix,
# build the out-of-tree example plugins (examples/plugin) against the
# installed package with find_package(attnbench), then load them into the
# installed attn: listed, verified over the standard suite, benchmarked. Also
# the refusals: another ABI version, a library that is not a plugin, a name
# taken twice; and a broken variant (K read transposed, patched in here, on
# the test side) must FAIL.
#   installed_package.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
source_dir=$1 build_dir=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
fail() { echo "FAILED: $*" >&2; exit 1; }

cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log"
attn=$prefix/bin/attn
[ -x "$attn" ] || fail "cmake --install put no attn in $prefix/bin"
for f in include/attnbench/plugin.h include/attnbench/cpp_plugin.hpp include/attnbench/backend.hpp \
         share/doc/attnbench/fixture-format-v1.md share/doc/attnbench/fixture-format-v2.md \
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
set +e
"$attn" verify --plugin "$c_plugin" --plugin "$cpp_plugin" -b example-c,example-cpp -t smoke -q --json "$work/verify.json" \
  > "$work/verify.txt" 2>&1
rc=$?
set -e
[ $rc -eq 0 ] || { tail -20 "$work/verify.txt"; fail "attn verify of the plugins exited $rc"; }
/usr/bin/python3 - "$work/verify.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d["summary"]["per_backend"]
# The smoke tier: every version 1 case passes; ABI 1 carries no version 2 field, so those SKIP.
assert c["example-c"]["PASS"] >= 18 and c["example-c"]["FAIL"] == 0, c["example-c"]
assert c["example-cpp"]["PASS"] >= 14 and c["example-cpp"]["FAIL"] == 0, c["example-cpp"]
reasons = [r["reason"] for r in d["results"] if r["backend"] == "example-cpp" and r["verdict"] == "SKIP"]
assert any("float64" in r for r in reasons), reasons  # not among its declared dtypes, with the reason
print("verified:", c)
PY

# Benchmarked: one problem of the quick preset, timed for real.
"$attn" bench --plugin "$c_plugin" -b example-c --preset quick --benchmark_filter='sq=1,sk=65536' \
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
  set +e
  "$@" > "$work/refusal.txt" 2>&1
  local code=$?
  set -e
  [ $code -eq 2 ] || { cat "$work/refusal.txt"; fail "$* exited $code, not 2"; }
  grep -q -- "$pattern" "$work/refusal.txt" || { cat "$work/refusal.txt"; fail "no '$pattern' in the refusal"; }
}
cc=${CC:-cc}
sed 's/return ATTN_PLUGIN_ABI_VERSION; }/return 99; }/' "$source_dir/examples/plugin/example_c.c" > "$work/abi99.c"
grep -q 'return 99; }' "$work/abi99.c" || fail "the ABI patch did not apply"
"$cc" -shared -fPIC -O1 -I"$prefix/include" -o "$work/libabi99.so" "$work/abi99.c" -lm
expect_refusal "built for plugin ABI version 99, but this attn speaks version 1" "$attn" list --plugin "$work/libabi99.so"
echo 'int not_a_plugin(void) { return 0; }' > "$work/plain.c"
"$cc" -shared -fPIC -o "$work/libplain.so" "$work/plain.c"
expect_refusal "not an attnbench plugin" "$attn" verify --plugin "$work/libplain.so"
expect_refusal "cannot load it" "$attn" list --plugin "$work/missing.so"
expect_refusal "is taken by plugin" "$attn" list --plugin "$c_plugin" --plugin "$c_plugin"

# A broken variant must FAIL: K read with its head-dim and sequence strides swapped.
sed 's/d \* ks\[3\]/d * ks[2]/; s/j \* ks\[2\]/j * ks[3]/' "$source_dir/examples/plugin/example_c.c" > "$work/broken.c"
cmp -s "$work/broken.c" "$source_dir/examples/plugin/example_c.c" && fail "the broken patch did not apply"
"$cc" -shared -fPIC -O1 -I"$prefix/include" -o "$work/libbroken.so" "$work/broken.c" -lm
set +e
"$attn" verify --plugin "$work/libbroken.so" -b example-c -t smoke -q > "$work/broken.txt" 2>&1
rc=$?
set -e
[ $rc -eq 1 ] || { cat "$work/broken.txt"; fail "the transposed-K plugin exited $rc, not 1"; }
grep -q "FAIL" "$work/broken.txt" || fail "the transposed-K plugin has no FAIL"
echo "installed package: OK"
