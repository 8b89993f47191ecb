"""cases, check and verify: the C++ verifier (_attnbench) over a user's kernel.

Every verdict comes from the verifier `attn verify` runs, through the same JSON writer; this
module only reads that JSON back into objects and text.
"""

import json as _json
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

from . import _kernel

__all__ = ["Case", "Result", "Verdict", "Report", "cases", "case", "check", "verify", "backends",
           "default_fixtures", "TIERS"]

TIERS = ("smoke", "full")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_native = None


def _c():
    global _native
    if _native is None:
        try:
            from . import _attnbench
        except ImportError as e:
            built = sorted(f for f in os.listdir(_PACKAGE_DIR) if f.startswith("_attnbench"))
            import sys
            raise ImportError(
                f"attnbench's compiled module ({', '.join(built) or 'none here'}) cannot be loaded by "
                f"{sys.executable} (Python {sys.version.split()[0]}): {e}. It is built for the interpreter "
                "CMake found (Debian's /usr/bin/python3): run that one, or a venv made from it "
                "(/usr/bin/python3 -m venv --system-site-packages V)") from e
        _native = _attnbench
    return _native


def default_fixtures():
    """The folder of the standard fixtures this attnbench carries."""
    return _c().default_fixtures(_PACKAGE_DIR)


def backends():
    """The names of the built-in backends (naive, blocked, streaming, ...)."""
    return list(_c().backends())


@dataclass(frozen=True)
class Case:
    """One fixture file: its name, tags, problem and features; inputs() reads its arrays."""
    path: str
    name: str
    description: str
    tags: tuple
    kind: str
    format_version: int
    gradients: bool
    features: tuple
    problem: SimpleNamespace = field(compare=False)

    @property
    def dtype(self):
        return self.problem.dtype

    def inputs(self):
        """q, k, v, out (the float64 golden), mask (bool), bias, kv_len, lse and, for
        gradient cases, dout, dq, dk, dv: float64 numpy arrays, [batch, heads, seq, dim]."""
        return SimpleNamespace(**_c().inputs(self.path))

    def __str__(self):
        return self.name


def _case_from(d):
    return Case(path=d["path"], name=d["name"], description=d["description"], tags=tuple(d["tags"]),
                kind=d["kind"], format_version=d["format_version"], gradients=d["gradients"],
                features=tuple(d["features"]), problem=d["problem"])


def _paths(path):
    if path is None:
        return [default_fixtures()]
    if isinstance(path, (str, os.PathLike)):
        return [os.fspath(path)]
    return [os.fspath(p) for p in path]


def cases(tier=None, *, tags=None, features=None, dtypes=None, kinds=("sdpa",), gradients=None, path=None):
    """The fixtures under `path` (default: the standard suite) as Cases, sorted by name.

    tier: "smoke" (the cases tagged smoke) or "full" (all); tags: only cases with any of these;
    features: only cases that need nothing beyond these (mask, bias, kv_len, causal, gqa, window,
    softcap, alibi, sinks, ragged, paged); dtypes: only these; kinds: "sdpa" and/or "layer";
    gradients: True for only the cases that hold gradients, False for none of them."""
    wanted_tags = list(tags or [])
    if tier is not None:
        if tier not in TIERS:
            raise ValueError(f"tier '{tier}' is none of {', '.join(TIERS)}")
        if tier == "smoke":
            wanted_tags.append("smoke")
    found = [_case_from(d) for d in _c().fixtures(_paths(path), wanted_tags)]
    if features is not None:
        allowed = set(features)
        found = [c for c in found if set(c.features) <= allowed]
    if dtypes is not None:
        found = [c for c in found if c.dtype in set(dtypes)]
    if kinds is not None:
        found = [c for c in found if c.kind in set(kinds)]
    if gradients is not None:
        found = [c for c in found if c.gradients == bool(gradients)]
    return sorted(found, key=lambda c: c.name)


def case(path):
    """The Case of one fixture file."""
    found = _c().fixtures([os.fspath(path)], [])
    if len(found) != 1:
        raise ValueError(f"{path} is not one fixture file")
    return _case_from(found[0])


@dataclass
class Result:
    """One run of one case: the verifier's JSON result (schemas/verify.schema.json) as attributes,
    with its reproduce command."""
    backend: str
    fixture: str
    file: str
    problem: str
    verdict: str
    reason: str
    threads: int
    layout: str
    direction: str
    reproduce: str
    data: dict = field(repr=False)

    def __getattr__(self, name):  # fields of the JSON result not named above
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        raise AttributeError(name)

    @property
    def tensors(self):
        """Each tensor scored (out, lse, probe, y, dq, dk, dv, dbias, dsinks): its own figures, as
        the JSON's "tensors" entries (error_over_bound, worst_index, max_abs_error, ...)."""
        return self.data.get("tensors", [])

    def tensor(self, name):
        """The score of one tensor by name, or None when it was not scored."""
        return next((t for t in self.tensors if t["name"] == name), None)

    @property
    def worst(self):
        """The tensor with the largest error/bound (a null one is not finite: the largest)."""
        return max(self.tensors, key=_bound_use, default=None)

    def _max(self, name):
        values = [v for v in (_figure_of(t, name) for t in self.tensors) if v is not None]
        return max(values) if values else None

    # The largest of each figure over the run's tensors (each tensor's own are in `tensors`).
    max_abs_error = property(lambda self: self._max("max_abs_error"))
    rms_error = property(lambda self: self._max("rms_error"))
    error_over_bound = property(lambda self: self._max("error_over_bound"))
    error_over_baseline = property(lambda self: self._max("error_over_baseline"))

    @property
    def worst_tensor(self):
        """The name of the tensor with the largest error/bound, or None."""
        return None if self.worst is None else self.worst["name"]

    @property
    def worst_index(self):
        """[b, h, i, d] of that tensor's worst element, in its own shape, or None."""
        return None if self.worst is None else self.worst.get("worst_index")


def _figure_of(tensor, name):
    """A tensor's figure; null is not finite (inf), except error_over_baseline (not measured: None)."""
    value = tensor.get(name)
    if value is None and name != "error_over_baseline":
        return float("inf")
    return value


def _bound_use(tensor):
    return _figure_of(tensor, "error_over_bound")


def _order():
    """The verifier's verdicts from the one that outranks every other (FAIL first), with ERROR (a
    case that could not be read) right after FAIL."""
    order = list(_c().VERDICT_SEVERITY)
    order.insert(order.index("FAIL") + 1, "ERROR")
    return order


def _worst(verdicts):
    for v in _order():
        if v in verdicts:
            return v
    return "SKIP"


def _figure(x):
    return "n/a" if x is None else f"{x:.3g}"


def _tensor_line(t):
    where = f", worst at {t['name']}{t['worst_index']}" if t.get("worst_index") is not None else ""
    return (f"{t['name']}: max |error| {_figure(t.get('max_abs_error'))}, rms {_figure(t.get('rms_error'))}, "
            f"error/bound {_figure(t.get('error_over_bound'))}, "
            f"error/baseline {_figure(t.get('error_over_baseline'))}{where}")


@dataclass
class Verdict:
    """A case's verdict over its runs (forward, and backward where the case has gradients, at each
    thread count and layout): the worst of them (FAIL > MISTRUSTED > DIFFERS > PASS > SKIP), ERROR
    when the fixture could not be read. `ok` unless FAIL or ERROR, as attn verify's exit code."""
    case: str
    backend: str
    verdict: str
    results: list
    errors: list
    notes: list

    @property
    def ok(self):
        return self.verdict not in ("FAIL", "ERROR")

    @property
    def skipped(self):
        return self.verdict == "SKIP"

    def _judged(self):
        return [r for r in self.results if r.verdict != "SKIP"]

    def _worst_result(self):
        failing = [r for r in self.results if r.verdict == self.verdict] or self.results
        return failing[0] if failing else None

    @property
    def reason(self):
        if self.errors:
            return "; ".join(self.errors)
        r = self._worst_result()
        return r.reason if r is not None else ""

    def _max(self, name):
        """The largest of a figure over every tensor of every run that was judged."""
        values = [v for v in (r._max(name) for r in self._judged()) if v is not None]
        return max(values) if values else None

    @property
    def max_abs_error(self):
        return self._max("max_abs_error")

    @property
    def rms_error(self):
        return self._max("rms_error")

    @property
    def error_over_bound(self):
        """The largest share of the a-priori error bound used (1 = at the bound)."""
        return self._max("error_over_bound")

    @property
    def error_over_baseline(self):
        """The largest share of the measured baseline (float32 / the dtype's reference) used."""
        return self._max("error_over_baseline")

    @property
    def worst_tensor(self):
        """The deciding run's tensor with the largest error/bound (out, lse, probe, y, dq, ...)."""
        r = self._worst_result()
        return None if r is None else r.worst_tensor

    @property
    def worst_index(self):
        """[b, h, i, d] of that tensor's worst element, in its own shape, or None."""
        r = self._worst_result()
        return None if r is None else r.worst_index

    @property
    def reproduce(self):
        r = self._worst_result()
        return None if r is None else r.reproduce

    def report(self):
        """What a person reads when the case fails: each run's verdict, figures and reason."""
        lines = [f"{self.verdict} {self.case} ({self.backend})"]
        lines += [f"  input error: {e}" for e in self.errors]
        for r in self.results:
            where = f"{r.direction}, threads {r.threads or 'default'}, {r.layout}"
            lines.append(f"  {r.verdict:<10} {where}")
            lines += [f"    {_tensor_line(t)}" for t in r.tensors]
            if r.reason:
                lines.append(f"    {r.reason}")
            if r.verdict in ("FAIL", "MISTRUSTED", "DIFFERS"):
                lines.append(f"    reproduce: {r.reproduce}")
        if self.results:
            lines.append(f"  problem: {self.results[0].problem}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self):
        return self.report()


@dataclass
class Report:
    """A verify run: each case's Verdict, attn verify's exit code and why, and its JSON."""
    verdicts: list
    exit_code: int
    why: str
    json: dict = field(repr=False)

    @property
    def ok(self):
        return self.exit_code == 0

    def counts(self):
        out = {}
        for v in self.verdicts:
            out[v.verdict] = out.get(v.verdict, 0) + 1
        return out

    def failures(self):
        return [v for v in self.verdicts if not v.ok]

    def report(self):
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()))
        lines = [v.report() for v in self.failures()]
        lines.append(f"{len(self.verdicts)} cases: {counts}" + (f"; {self.why}" if self.why else ""))
        return "\n".join(lines)

    def __str__(self):
        return self.report()


def _as_backend(kernel):
    """A built-in backend's name, a Kernel, a backend-contract object, or a function (made a Kernel
    with the defaults: NumPy, every dtype, features from its signature)."""
    if isinstance(kernel, str) or isinstance(kernel, _kernel.Kernel):
        return kernel
    if all(hasattr(kernel, a) for a in ("NAME", "DESCRIPTION", "available", "supports", "prepare")):
        return kernel
    if callable(kernel):
        return _kernel.Kernel(kernel)
    raise TypeError(f"{kernel!r} is neither a backend name, an attnbench.Kernel nor a function")


def _name_of(backend):
    return backend if isinstance(backend, str) else str(backend.NAME)


def load_kernel(path, name):
    """The object `name` of the Python file `path` (its folder first on sys.path, so that it imports
    its neighbours): how a verdict's reproduce line names a kernel defined in a module."""
    import importlib.util
    import sys

    path = os.path.abspath(path)
    module_name = os.path.splitext(os.path.basename(path))[0]
    module = sys.modules.get(module_name)
    if module is None or os.path.abspath(getattr(module, "__file__", "") or "") != path:
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    found = module
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _kernel_expression(kernel, backend):
    """Python that evaluates to the object the user passed: attnbench.load_kernel(file, name) when a
    module-level name holds it, else None."""
    import sys

    fn = getattr(backend, "fn", kernel)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if not path:
        return None
    for name, value in list(vars(module).items()):
        if value is kernel:
            return f"attnbench.load_kernel({os.path.abspath(path)!r}, {name!r})"
    return None


def _python_reproduce(kernel, backend, case_path, threads, layouts, direction):
    args = [f"attnbench.case({case_path!r})"]
    if threads != [0]:
        args.append(f"threads={threads}")
    if layouts != ["bhsd"]:
        args.append(f"layouts={layouts}")
    if direction == "backward":
        args.append(f"directions=[{direction!r}]")
    expression = _kernel_expression(kernel, backend)
    if expression is None:  # defined inside a function, a lambda: only the caller can name it
        return (f"attnbench.check(<the kernel object {_name_of(backend)!r}>, {', '.join(args)})  "
                f"# not a module-level name, so this line cannot load it")
    return f"import attnbench; attnbench.check({expression}, {', '.join(args)})"


def _run(kernels, case_list, *, threads, layouts, directions, json=None, junit=None):
    backends = [_as_backend(k) for k in kernels]
    if not backends:
        raise ValueError("no kernel to verify")
    files = [c.path if isinstance(c, Case) else os.fspath(c) for c in case_list]
    if not files:
        raise ValueError("no cases to verify")
    threads = [int(t) for t in (threads if threads is not None else [0])]
    layouts = list(layouts if layouts is not None else ["bhsd"])
    native = _c()
    command = native.attn_command(_PACKAGE_DIR)
    raw = native.verify(files, backends, threads, layouts, list(directions or []), os.fspath(junit or ""),
                        command)
    text = raw["json"]
    data = _json.loads(text)
    if json is not None:
        with open(json, "w") as f:
            f.write(text)
    by_name = {_name_of(b): (k, b) for k, b in zip(kernels, backends)}
    grouped = {}
    for r, reproduce in zip(data["results"], raw["reproduce"]):
        kernel, backend = by_name.get(r["backend"], (None, None))
        if backend is not None and not isinstance(backend, str):
            reproduce = _python_reproduce(kernel, backend, r["file"], threads, layouts, r.get("direction"))
        result = Result(backend=r["backend"], fixture=r["fixture"], file=r["file"], problem=r["problem"],
                        verdict=r["verdict"], reason=r["reason"], threads=r["threads"], layout=r["layout"],
                        direction=r.get("direction", "forward"), reproduce=reproduce, data=r)
        grouped.setdefault((r["backend"], os.path.abspath(r["file"])), []).append(result)
    verdicts = []
    for backend in backends:
        notes = []
        if isinstance(backend, _kernel.Kernel) and backend.framework.note():
            notes.append(backend.framework.note())
        for f in files:
            results = grouped.get((_name_of(backend), os.path.abspath(f)), [])
            errors = [e["message"] for e in data["input_errors"]
                      if e["file"] and os.path.abspath(e["file"]) == os.path.abspath(f)]
            verdict = "ERROR" if errors else _worst({r.verdict for r in results})
            name = results[0].fixture if results else os.path.basename(f)
            verdicts.append(Verdict(case=name, backend=_name_of(backend), verdict=verdict, results=results,
                                    errors=errors, notes=list(notes)))
    return Report(verdicts=verdicts, exit_code=raw["exit_code"], why=raw["why"], json=data)


def check(kernel, case, *, threads=None, layouts=None, directions=None):
    """Judges `kernel` (a function, an attnbench.Kernel or a built-in backend's name) on one case
    exactly as attn verify does: forward, the normalisation probe, and the backward where the case
    has gradients and the kernel declares one. Returns a Verdict."""
    c = case if isinstance(case, Case) else globals()["case"](case)
    return _run([kernel], [c], threads=threads, layouts=layouts, directions=directions).verdicts[0]


def verify(kernel, cases=None, *, tier=None, threads=None, layouts=None, directions=None, json=None, junit=None):
    """Judges `kernel` (or a list of kernels and backend names, side by side) over many cases
    (default: the standard suite, or its `tier`) in one verifier run; json= and junit= write attn
    verify's reports. Returns a Report: a Verdict per kernel and case, exit_code as attn verify's."""
    if cases is None:
        cases = globals()["cases"](tier)
    kernels = list(kernel) if isinstance(kernel, (list, tuple)) else [kernel]
    return _run(kernels, list(cases), threads=threads, layouts=layouts, directions=directions, json=json,
                junit=junit)
