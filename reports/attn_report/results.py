"""Parsing `attn bench` (Google Benchmark JSON) and `attn verify --json` files."""
import json
from pathlib import Path
import statistics
from dataclasses import dataclass, field


@dataclass
class Problem:
    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    causal: str = "none"
    text: str = ""
    # Format version 2 (docs/format/v2.md): what makes a case more than its sizes.
    window_left: int = -1
    window_right: int = -1
    align: str = "bottom_right"
    ragged: bool = False
    page_size: int = 0
    others: tuple = ()  # softcap, alibi, sinks
    # The bench's own counts (attn bench writes them per case): packed and
    # paged cases' pairs depend on lengths the problem string does not carry.
    counted_useful: float = None
    counted_dense: float = None
    # What was timed: "forward", "backward" (the backward pass alone) or
    # "forward+backward" (attn bench --direction); the counted flops are the
    # direction's (2.5 and 3.5 times the forward's, FlashAttention's count).
    direction: str = "forward"

    @property
    def decode(self):
        return self.seq_q == 1

    @property
    def variant(self):
        """The version 2 additions as a short label ('' for none): 'window 512', 'packed x6', 'paged 16', ..."""
        parts = []
        if self.window_left >= 0 or self.window_right >= 0:
            sides = [str(w) if w >= 0 else "inf" for w in (self.window_left, self.window_right)]
            parts.append("window " + (sides[0] if self.window_right < 0 else ":".join(sides)))
        if self.ragged:
            parts.append(f"packed x{self.batch}")
        if self.page_size:
            parts.append(f"paged {self.page_size}")
        parts.extend(self.others)
        return ", ".join(parts)

    def visible_pairs(self):
        """Query-key pairs the causal alignment and the window leave visible (all when neither)."""
        diag = self.seq_k - self.seq_q if (self.causal if self.causal != "none" else self.align) == "bottom_right" else 0
        pairs = 0
        for i in range(self.seq_q):
            lo, hi = 0, self.seq_k
            if self.causal != "none":
                hi = min(hi, i + diag + 1)
            if self.window_right >= 0:
                hi = min(hi, i + diag + self.window_right + 1)
            if self.window_left >= 0:
                lo = max(lo, i + diag - self.window_left)
            pairs += max(0, hi - lo)
        return pairs

    def useful_flops(self):
        """attnbench's convention (bench/matrix.cpp): 2 (d + dv) flops per visible pair per query head."""
        if self.counted_useful:
            return self.counted_useful
        return 2.0 * (self.head_dim + self.head_dim_v) * self.batch * self.heads_q * self.visible_pairs()

    def dense_flops(self):
        """The figure tools that count every pair, causal or windowed or not, report."""
        if self.counted_dense:
            return self.counted_dense
        return 2.0 * (self.head_dim + self.head_dim_v) * self.batch * self.heads_q * self.seq_q * self.seq_k

    def min_bytes(self):
        """Q, K, V read once and the output written once: the least memory traffic;
        the backward reads those and dO and writes dQ, dK, dV (twice as much)."""
        size = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2}.get(self.dtype, 4)
        elements = (self.batch * self.heads_q * self.seq_q * (self.head_dim + self.head_dim_v) +
                    self.batch * self.heads_kv * self.seq_k * (self.head_dim + self.head_dim_v))
        passes = {"forward": 1, "backward": 2, "forward+backward": 3}.get(self.direction, 1)
        return float(size * elements * passes)

    @property
    def shape_label(self):
        label = f"{self.dtype} h{self.heads_q}"
        if self.heads_kv != self.heads_q:
            label += f":{self.heads_kv}"
        label += f" q{self.seq_q} k{self.seq_k} d{self.head_dim}"
        if self.causal != "none":
            label += " causal"
        if self.variant:
            label += ", " + self.variant
        if self.direction != "forward":
            label += f" [{self.direction}]"
        return label


def parse_problem(text):
    """The canonical problem string of attnbench/problem.hpp, e.g.
    'dtype=f16,b=2,hq=4,hkv=2,sq=17,sk=33,d=64,dv=64,scale=0.125,causal=bottom_right'."""
    fields = {}
    for token in text.split(","):
        key, _, value = token.partition("=")
        fields[key] = value
    try:
        others = tuple(f"softcap {fields['softcap']}" if key == "softcap" else key
                       for key in ("softcap", "alibi", "sinks") if key in fields)
        return Problem(dtype=fields["dtype"], batch=int(fields["b"]), heads_q=int(fields["hq"]),
                       heads_kv=int(fields["hkv"]), seq_q=int(fields["sq"]), seq_k=int(fields["sk"]),
                       head_dim=int(fields["d"]), head_dim_v=int(fields.get("dv", fields["d"])),
                       causal=fields.get("causal", "none"), text=text,
                       window_left=int(fields.get("wl", -1)), window_right=int(fields.get("wr", -1)),
                       align=fields.get("align", "bottom_right"), ragged="ragged" in fields,
                       page_size=int(fields["paged"].split("x")[0]) if "paged" in fields else 0, others=others)
    except (KeyError, ValueError) as error:
        raise ValueError(f"not an attn problem string: {text!r} ({error})") from None


@dataclass
class Measurement:
    """One benchmark (backend x problem) of one results file, over its repetitions."""
    host: str
    backend: str
    problem: Problem
    name: str
    threads: int
    seconds: list = field(default_factory=list)  # per repetition
    flops: list = field(default_factory=list)    # FLOP/s per repetition
    kv_bytes: list = field(default_factory=list)
    extra_mib: float = None
    skipped: str = None

    @property
    def median_seconds(self):
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def gflops(self):
        return statistics.median(self.flops) / 1e9 if self.flops else None

    @property
    def kv_gbs(self):
        return statistics.median(self.kv_bytes) / 1e9 if self.kv_bytes else None

    @property
    def repetitions(self):
        return len(self.seconds)

    def moved_bytes(self):
        """The least bytes a call moves: the problem's min_bytes(), except that a
        decode the bench counted K and V bytes for (KV_bytes/s times the time of
        a call: a paged or packed batch's own lengths, not the table's capacity)
        counts those beside Q and the output."""
        p = self.problem
        if not (self.kv_bytes and self.seconds and p.direction == "forward"):
            return p.min_bytes()
        size = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2}.get(p.dtype, 4)
        q_and_out = size * p.batch * p.heads_q * p.seq_q * (p.head_dim + p.head_dim_v)
        return float(q_and_out + self.kv_bytes[0] * self.seconds[0])

    def roofline_bound(self, peak, bandwidth):
        """GFLOP/s the machine allows this case: the smaller of the compute peak
        and bandwidth x arithmetic intensity (useful flops per moved byte); None
        without either figure."""
        if not peak or not bandwidth:
            return None
        return min(peak, bandwidth * self.problem.useful_flops() / self.moved_bytes())

    @property
    def gflops_iqr(self):
        """(first quartile, third quartile) of GFLOP/s over the repetitions; None with fewer than 2."""
        return _quartiles([f / 1e9 for f in self.flops])

    @property
    def kv_gbs_iqr(self):
        return _quartiles([b / 1e9 for b in self.kv_bytes])

    @property
    def seconds_iqr(self):
        return _quartiles(self.seconds)


def _quartiles(values):
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


@dataclass
class BenchFile:
    path: str
    host: str
    context: dict
    measurements: list

    def peak(self, key):
        value = self.context.get(f"attn_peak_{key}")
        return float(value) if value not in (None, "") else None


_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
DIRECTIONS = ("forward", "backward", "forward+backward")


def load_bench(path, data=None):
    """Reads one Google Benchmark JSON file written by `attn bench`."""
    if data is None:
        data = read_json(path)
        if not isinstance(data, dict) or "benchmarks" not in data or "context" not in data:
            raise ValueError(f"{path}: not Google Benchmark JSON (no 'benchmarks' and 'context')")
        validate(path, data, "bench")
    if "benchmarks" not in data or "context" not in data:
        raise ValueError(f"{path}: not Google Benchmark JSON (no 'benchmarks' and 'context')")
    context = data["context"]
    host = context.get("host_name", "host")
    by_name = {}
    for entry in data["benchmarks"]:
        if entry.get("run_type", "iteration") != "iteration":
            continue  # mean/median/stddev aggregates: we compute our own
        name = entry.get("run_name", entry["name"])
        parts = name.split("/")
        if len(parts) < 2:
            continue
        backend, problem = parts[0], parse_problem(parts[1])
        if len(parts) > 2 and parts[2] in DIRECTIONS[1:]:  # <backend>/<problem>/<direction>/manual_time
            problem.direction = parts[2]
            problem.text += f" [{parts[2]}]"  # a case of its own wherever cases are told apart
        m = by_name.get(name)
        if m is None:
            threads = int(entry.get("attn_threads", context.get("attn_threads", 1)))
            m = by_name[name] = Measurement(host, backend, problem, name, threads)
        if entry.get("error_occurred"):
            m.skipped = entry.get("error_message", "skipped")
            continue
        m.seconds.append(entry["real_time"] * _UNIT[entry.get("time_unit", "ns")])
        if "FLOP/s" in entry:
            m.flops.append(entry["FLOP/s"])
        if "KV_bytes/s" in entry:
            m.kv_bytes.append(entry["KV_bytes/s"])
        if "extra_MiB" in entry:
            m.extra_mib = entry["extra_MiB"]
        if "useful_flops" in entry:
            problem.counted_useful = entry["useful_flops"]
        if "dense_flops" in entry:
            problem.counted_dense = entry["dense_flops"]
    return BenchFile(path, host, context, list(by_name.values()))


def merge(files):
    """Several result files into one list. Files from one machine (the same
    host_name and CPU model) are one host: the repetitions of a benchmark at one
    thread count are pooled. A host_name seen with another CPU model is told
    apart by its file. Hosts stay side by side."""
    models = {}
    for f in files:
        model = f.context.get("attn_cpu_model", "")
        if f.host in models and models[f.host] != model:
            f.host = f"{f.host} ({f.path.rsplit('/', 1)[-1]})"
            for m in f.measurements:
                m.host = f.host
        models.setdefault(f.host, model)
    pooled = {}
    for f in files:
        for m in f.measurements:
            key = (m.host, m.name, m.threads)
            if key not in pooled:
                pooled[key] = m
                continue
            into = pooled[key]
            into.seconds += m.seconds
            into.flops += m.flops
            into.kv_bytes += m.kv_bytes
            if m.extra_mib is not None:
                into.extra_mib = max(into.extra_mib or 0.0, m.extra_mib)
            if not into.seconds:  # skipped everywhere so far: keep a reason
                into.skipped = into.skipped or m.skipped
    return list(pooled.values())


class VerifyResults(list):
    """`attn verify --json` results (a list of result dicts) with the run's
    limits (`limits`: error_over_bound and error_over_baseline), when given."""

    def __init__(self, results, limits=None):
        super().__init__(results)
        self.limits = limits

    @property
    def results(self):
        return self


VERIFY_SCHEMAS = ("attn-verify-2", "attn-verify-1")


def _tensors_of_v1(r):
    """An attn-verify-1 result's scores as attn-verify-2 tensors: a forward result's figures were
    out's; a backward result's are read from its "gradients" (its own were the worst of them)."""
    if r.get("verdict") == "SKIP":
        return []
    if r.get("direction") == "backward":
        return [dict(g) for g in r.get("gradients", [])]
    return [{"name": "out", "error_over_bound": r.get("error_over_bound"),
             "error_over_baseline": r.get("error_over_baseline")}]


def load_verify(path, data=None):
    """Reads `attn verify --json` output: the result dicts (each with its "tensors") and the limits."""
    if data is None:
        with open(path) as f:
            data = json.load(f)
    if data.get("schema") not in VERIFY_SCHEMAS:
        raise ValueError(f"{path}: not `attn verify --json` output (schema {data.get('schema')!r}, "
                         f"not one of {', '.join(VERIFY_SCHEMAS)})")
    results = data["results"]
    if data["schema"] == "attn-verify-1":
        results = [dict(r, tensors=_tensors_of_v1(r)) for r in results]
    return VerifyResults(results, data.get("limits"))


def is_golden(r):
    """Whether a verify result is the comparison with the golden (absent "check": older files)."""
    return r.get("check", "golden") == "golden"


def verify_summary(results):
    """Per (backend, dtype): counts of each verdict and the worst error/bound over every tensor of
    the golden comparison (the checks without a golden have their own table: check_summary)."""
    table = {}
    for r in results:
        if not is_golden(r):
            continue
        problem = r["problem"].split(",model=")[0]
        dtype = parse_problem(problem).dtype
        row = table.setdefault((r["backend"], dtype), {"PASS": 0, "FAIL": 0, "SKIP": 0, "MISTRUSTED": 0,
                                                          "DIFFERS": 0, "worst": None})
        row[r["verdict"]] += 1
        for t in r.get("tensors", []):
            ratio = t.get("error_over_bound")
            ratio = float("inf") if ratio is None else ratio  # null: not finite
            row["worst"] = ratio if row["worst"] is None else max(row["worst"], ratio)
    return table


CHECK_OUTCOMES = ("EXACT", "HOLDS", "INVARIANT", "VARIES")


def check_summary(results):
    """Per (backend, check) of the checks that need no golden (batch invariance, each relation):
    counts of each verdict, and of how a PASS or DIFFERS held (bit for bit: EXACT, INVARIANT;
    within the bound: HOLDS, VARIES), from the start of its reason."""
    table = {}
    for r in results:
        if is_golden(r):
            continue
        key = (r["backend"], r["check"] + (" (backward)" if r.get("direction") == "backward" else ""))
        row = table.setdefault(key, dict.fromkeys(("PASS", "FAIL", "SKIP", "MISTRUSTED", "DIFFERS") + CHECK_OUTCOMES, 0))
        row[r["verdict"]] += 1
        for outcome in CHECK_OUTCOMES:
            if r.get("reason", "").startswith(outcome):
                row[outcome] += 1
    return table


SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def validate(path, data, kind):
    """Raises ValueError naming the file, the field and the rule when `data`
    is not what the report reads (schemas/report-input.schema.json)."""
    schema_path = SCHEMAS / "report-input.schema.json"
    try:
        import jsonschema
    except ImportError:  # python3-jsonschema is a dependency; without it the loaders' own checks remain
        return
    with open(schema_path) as f:
        full = json.load(f)
    # The part for this kind of file, so the message is about its fields.
    schema = {"$schema": full["$schema"], "$defs": full["$defs"], "$ref": f"#/$defs/{kind}"}
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.path)))
    if errors:
        where = "/".join(map(str, errors[0].path)) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"{path}: {where}: {errors[0].message}{more} (see schemas/{schema_path.name})")


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from None


def detect(path):
    """'bench' or 'verify', from the file's content, checked against its schema."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: neither `attn bench` nor `attn verify --json` output (not a JSON object)")
    if data.get("schema") in VERIFY_SCHEMAS:
        validate(path, data, "verify")
        return "verify", data
    if "benchmarks" in data:
        validate(path, data, "bench")
        return "bench", data
    raise ValueError(f"{path}: neither `attn bench` nor `attn verify --json` output")
