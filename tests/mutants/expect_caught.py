#!/usr/bin/python3
"""Proves that `make verify` catches the mutants whose witnesses are in one folder.

make verify runs every fixture of fixtures/golden under VERIFY_ARGS (read from the
Makefile), so a FAIL of a mutant on any of them under those options is a FAIL of make
verify, and so is a FAIL under any one of the (threads, layout) pairs it runs. One run
over the folder (the truth of each case computed once for all its mutants) at make
verify's first pair, then one at every pair for the mutants the first did not catch,
asserts:
  - exit 1 (FAIL, not an input error) of the run that decides;
  - each mutant's own fixture is among its FAILs;
  - at least two different fixtures of the folder FAIL each mutant, so no catch hangs
    on a single witness.
A mutant that `attn list` shows as unavailable on this machine (the AVX-512 kernels'
exp2 on a CPU that runs others) is left out with its reason; when none is left the
test exits 77, which ctest reports as skipped.

    expect_caught.py CLI MAKEFILE FOLDER[:only=GLOBS|:skip=GLOBS] OUT MUTANT=WITNESS...

FOLDER may name a part of the folder (its files whose names match, or do not
match, any of comma-separated globs): a mutant that FAILs there FAILs make verify, which runs them all.
"""
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys


BACKWARD_PREFIXES = ("bwd_", "fbwd_", "openblas_bwd_")


def fixtures_of(spec):
    """The folder, and the fixture files (or the folder itself) attn verify is given."""
    folder, _, part = spec.partition(":")
    if not part:
        return folder, [folder]
    kind, _, patterns = part.partition("=")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".h5"))
    keep = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns.split(",")) == (kind == "only")]
    if kind not in ("only", "skip") or not keep:
        sys.exit(f"{spec}: expected FOLDER:only=GLOB[,GLOB...] or FOLDER:skip=GLOB[,GLOB...] matching some of its files")
    return folder, [os.path.join(folder, n) for n in keep]


def main():
    cli, makefile, spec, out = sys.argv[1:5]
    folder, inputs = fixtures_of(spec)
    pairs = [arg.split("=", 1) for arg in sys.argv[5:]]
    with open(makefile) as f:
        line = next((l for l in f if re.match(r"^VERIFY_ARGS \??= ", l)), None)
    if line is None:
        sys.exit(f"{makefile} has no VERIFY_ARGS line")
    args = shlex.split(re.sub(r"^VERIFY_ARGS \??= ", "", line))
    listing = subprocess.run([cli, "list"], capture_output=True, text=True, check=True).stdout
    available = []
    for name, witness in pairs:
        if re.search(rf"^{re.escape(name)}\s+no\b", listing, re.M):
            reason = re.search(rf"^{re.escape(name)}\s+no\b.*\n\s+why not:\s+(.*)$", listing, re.M)
            print(f"SKIPPED {name}: {reason.group(1) if reason else 'unavailable here'}")
        else:
            available.append((name, witness))
    if not available:
        sys.exit(77)
    pairs = available
    os.makedirs(out, exist_ok=True)
    # One report per part: the parts of a folder run side by side.
    report = os.path.join(out, re.sub(r"[^A-Za-z0-9_]+", "_", os.path.basename(folder) + spec[len(folder):]) + ".json")
    # Mutants of a backward (bwd_* of naive's, fbwd_* of the fast one,
    # openblas_bwd_* of openblas's) compute their backend's own forward: only
    # their gradients can FAIL, so only those are judged (make verify judges
    # both), and by the comparison with the golden alone: make verify runs the
    # checks without a golden besides, so a FAIL here is one of make verify's
    # all the same, in half the time.
    if all(name.startswith(BACKWARD_PREFIXES) for name, _ in pairs):
        args = [*args, "--direction", "backward", "--skip-check", "invariance,relations"]
    # The dropout mutants are caught by the dropout rows, which make verify
    # runs beside the golden comparison; the batch invariance and the
    # relations of their folder would only repeat the real backends' work.
    elif os.path.basename(folder) == "dropout":
        args = [*args, "--skip-check", "invariance,relations"]
    # make verify runs every (threads, layout) pair of its lists, and a FAIL
    # in any is its FAIL: the mutants are first judged at the first pair
    # alone, and only those it does not catch twice at all of them.
    first = first_configuration(args)
    left = pairs
    for phase_args in ([first, args] if first != args else [args]):
        run = subprocess.run([cli, "verify", *inputs, "--backend", ",".join(name for name, _ in left), *phase_args,
                              "--quiet", "--json", report], capture_output=True, text=True)
        last = phase_args is args
        if run.returncode not in ((1,) if last else (0, 1)):
            sys.exit(f"{','.join(n for n, _ in left)} on {folder} with {phase_args}: exit {run.returncode}, "
                     f"expected {'1' if last else '0 or 1'}\n{run.stdout}\n{run.stderr}")
        with open(report) as f:
            results = json.load(f)["results"]
        missed = []
        for name, witness in left:
            failed = sorted({r["fixture"] for r in results if r["backend"] == name and r["verdict"] == "FAIL"})
            forward = sorted({r["fixture"] for r in results if r["backend"] == name and r["verdict"] == "FAIL"
                              and r.get("direction", "forward") == "forward"})
            if name.startswith(BACKWARD_PREFIXES) and forward:
                sys.exit(f"{name}: its forward FAILs on {forward}; a backward mutant must break only the backward")
            if witness in failed and len(failed) >= 2:
                at = "" if last else " at " + " ".join(first_pair(phase_args))
                print(f"{name}: caught by {len(failed)} fixtures of {os.path.basename(folder)}/{at}")
                continue
            if not last:
                missed.append((name, witness))
            elif witness not in failed:
                sys.exit(f"{name}: its own fixture {witness} does not FAIL it under make verify's options "
                         f"(failing: {failed})")
            else:
                sys.exit(f"{name}: only {len(failed)} fixture of {folder} catches it ({failed}); add a second witness")
        left = missed
        if not left:
            return


def first_configuration(args):
    """make verify's options with only the first of its thread counts and of its layouts."""
    out = list(args)
    for option in ("--threads", "--layout"):
        if option in out:
            at = out.index(option) + 1
            out[at] = out[at].split(",")[0]
    return out


def first_pair(args):
    """The threads and layout of a first configuration, for the report."""
    shown = []
    for option in ("--threads", "--layout"):
        if option in args:
            shown += [option, args[args.index(option) + 1]]
    return shown

if __name__ == "__main__":
    main()
