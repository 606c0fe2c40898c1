"""The command line's grammar cache files: what `compile --out` may replace, and `generate --grammar FILE`
checked against the run's own flags.

    check_compile_out(out, tokenizer_path)   before compiling: never into a tokenizer/model directory, never
                                             over a file that is not a batchmask grammar cache
    GrammarFile.read(path)                   a `--grammar` file's settings (one line if it is no cache file)
    .check_flags(registry, args)             before the model loads: the flag that differs, by name
    .check_vocab(tokenizer)                  once the tokenizer is loaded: --tokenizer / --eos-id
    schema_args(parser)                      the flags of the schemas' reading: --schema-mode, --open-objects

The loader (CompiledGrammar.load) checks the same file field by field in its own terms (`key`, `utf8`,
`vocab_hash`); these checks come first and say it in the terms a person typed: the CLI flag and short values.
"""
from __future__ import annotations

import json
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..text import short

CACHE_PREFIX = "batchmask-grammar/"     # every cache format's name starts so (grammar_cache.CACHE_FORMAT)

# Files whose presence makes a directory a tokenizer's or a model's: a grammar cache written among them would
# mix batchmask's files into a checkpoint or a hub snapshot (a new file is no overwrite, but it is still not
# the user's to make there). config.json alone is too common a name; it counts beside weights.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer.bin", "tokenizer_config.json")
_WEIGHT_GLOBS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "model.bin")


# --- compile --out -----------------------------------------------------------------------------------
def check_compile_out(out, tokenizer_path) -> None:
    """Refuse `compile --out OUT` inside the --tokenizer's directory or any tokenizer/model directory, and
    over an existing file that is not a batchmask grammar cache (an older cache may be replaced)."""
    if out is None:
        return
    p = Path(out)
    folder = p.parent.resolve()
    tok = Path(tokenizer_path)
    # the tokenizer's folder as named and as linked to (a symlinked tokenizer.json lives in both)
    tok_dirs = {tok.resolve(), tok.absolute()} if tok.is_dir() else {tok.resolve().parent, tok.absolute().parent}
    if folder in {d.resolve() for d in tok_dirs}:
        raise ValueError(f"--out {p}: inside the --tokenizer's directory {p.parent}; write the grammar cache "
                         "elsewhere")
    marker = model_dir_marker(folder)
    if marker is not None:
        raise ValueError(f"--out {p}: inside a tokenizer/model directory (it holds {marker}); write the grammar "
                         "cache elsewhere")
    if p.exists():
        why = not_a_cache(p)
        if why is not None:
            raise ValueError(f"--out {p}: exists and is not a batchmask grammar cache ({why}); not overwriting "
                             "it: pass another path, or remove it first")


def model_dir_marker(folder: Path) -> str | None:
    """The file that makes `folder` a tokenizer's or a model's directory, or None."""
    for name in _TOKENIZER_FILES:
        if (folder / name).is_file():
            return name
    for pattern in _WEIGHT_GLOBS:
        hit = next(iter(sorted(folder.glob(pattern))), None)
        if hit is not None and (pattern != "model.bin" or (folder / "config.json").is_file()
                                or any((folder / n).is_file() for n in _TOKENIZER_FILES)):
            return hit.name
    return None


# --- reading a cache file's settings, without trusting it ---------------------------------------------
def _describe(p: Path) -> str:
    """What a file that is no zip archive looks like, from its first bytes (for the one error line)."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError as e:
        return f"cannot read it: {e.strerror or type(e).__name__}"
    if not head:
        return "it is empty"
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < (1 << 28):
        return "it looks like a .safetensors file"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b"["):
        return "it holds JSON text"
    try:
        head.decode("utf-8")
        return "it holds text"
    except UnicodeDecodeError as e:
        return "it holds text" if e.start > len(head) - 4 else "not a zip archive"


def _payload(p: Path):
    """(payload, None) from a torch zip file, or (None, why not): torch's own errors and warnings stay inside
    (weights_only's refusal is a paragraph about pickles, not about this file)."""
    if not zipfile.is_zipfile(p):
        return None, _describe(p)
    import torch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(p, map_location="cpu", weights_only=True, mmap=True), None
    except Exception:                  # torch raises many kinds on a zip that is not its own, or a foreign pickle
        return None, "a zip archive that is no torch file of plain tensors"


def _cache_meta(p: Path):
    """(meta, None) if `p` is a batchmask grammar cache (of any format version), else (None, why not)."""
    if p.is_dir():
        return None, "it is a directory"
    payload, why = _payload(p)
    if payload is None:
        return None, why
    meta = payload.get("meta") if isinstance(payload, dict) else None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if not (isinstance(fmt, str) and fmt.startswith(CACHE_PREFIX)):
        return None, "a torch file without batchmask's grammar settings"
    return meta, None


def not_a_cache(p: Path) -> str | None:
    """None if `p` is a batchmask grammar cache (of any format version), else why not (a few words)."""
    return _cache_meta(p)[1]


@dataclass
class GrammarFile:
    """A `--grammar` file's recorded settings (grammar_cache's meta), in the CLI's terms."""
    path: Path
    meta: dict

    @classmethod
    def read(cls, path) -> GrammarFile:
        from ..compiler.cache import CACHE_FORMAT
        p = Path(path)
        if not p.exists():
            raise ValueError(f"--grammar {p}: not found")
        meta, why = _cache_meta(p)
        if meta is None:
            raise ValueError(f"--grammar {p}: not a batchmask grammar cache ({why}); `batchmask compile --out FILE` "
                             "writes one")
        if meta["format"] != CACHE_FORMAT:
            raise ValueError(f"--grammar {p}: written by another batchmask version (cache format "
                             f"{short(meta['format'])}, this one reads {CACHE_FORMAT!r}); compile it again")
        return cls(p, meta)

    # --- the flags a call grammar is built from ---------------------------------------------------------
    def file_settings(self) -> dict:
        """flag -> what the file was built with. The seed path's key holds the registry's names and required
        args and max_string only (format seed); a call grammar's key holds everything."""
        key = self.meta.get("key") if isinstance(self.meta.get("key"), dict) else {}
        kind = key.get("grammar")
        if kind not in ("seed", "call"):
            raise ValueError(f"--grammar {self.path}: holds a {short(kind, 30)} grammar, not one tool set's call "
                             "grammar (what `batchmask compile` writes)")
        seed = kind == "seed"
        return {"--tool-choice": key.get("choice"), "--format": "seed" if seed else key.get("format"),
                "--tools": [kind, key.get("registry")],
                "--max-string": key.get("max_string"), "--bytes": not self.meta.get("utf8", True),
                "options": None if seed else key.get("options")}

    def check_flags(self, registry, args) -> None:
        """Refuse a file built for other --format, --tools, --max-string or --bytes than this run's, naming the
        first flag that differs with short values (the run's registry `registry`, its flags `args`)."""
        from .. import api
        from ..tools.envelope import registry_key
        from .loading import schema_options
        fmt, utf8, options = args.format, not args.bytes, schema_options(args)
        seed = api.uses_seed_path(registry, fmt)
        choice = getattr(registry, "choice", None)       # first: a file without one was compiled on another path
        run = {"--tool-choice": None if choice is None else api.call_grammar_key(registry, fmt)["choice"],
               "--format": fmt,
               "--tools": ["seed", registry.grammar_key()] if seed else ["call", registry_key(registry)],
               "--max-string": args.max_string, "--bytes": not utf8,
               "options": None if seed else api.call_grammar_key(registry, fmt, args.max_string, utf8,
                                                                 options)["options"]}
        got = self.file_settings()
        for flag, want in run.items():
            have, want = _plain(got.get(flag)), _plain(want)
            if have == want:
                continue
            if flag == "--tools":
                theirs, ours = _tool_names(have), _tool_names(want)
                what = (f"the same tool names ({_cut(ours)}) with other arguments" if theirs == ours else
                        f"the file's are {_cut(theirs)}, this run's {_cut(ours)}")
                raise ValueError(f"--grammar {self.path}: compiled for other tools (--tools): {what}")
            if flag == "options":
                theirs = have if isinstance(have, dict) else {}
                mode, opened = theirs.get("mode"), theirs.get("open_objects")
                if mode and mode != options.mode:
                    raise ValueError(f"--grammar {self.path}: compiled with --schema-mode {mode}, this run has "
                                     f"--schema-mode {options.mode}")
                if opened is not None and opened != options.open_objects:
                    raise ValueError(f"--grammar {self.path}: compiled {'with' if opened else 'without'} "
                                     f"--open-objects, this run {'has' if options.open_objects else 'has no'} "
                                     "--open-objects")
                raise ValueError(f"--grammar {self.path}: compiled with other schema options (by the library or "
                                 "another batchmask version); compile it again with `batchmask compile`")
            if flag == "--bytes":
                raise ValueError(f"--grammar {self.path}: compiled {'with' if have else 'without'} --bytes, this run "
                                 f"{'has' if want else 'has no'} --bytes")
            shown = lambda v: short(v, 40)
            raise ValueError(f"--grammar {self.path}: compiled for another {flag}: the file's is {shown(have)}, "
                             f"this run's {shown(want)}")

    def check_vocab(self, tokenizer) -> None:
        """Refuse a file compiled against another vocabulary (--tokenizer) or other stop tokens (--eos-id)."""
        from ..table.tokensim import stop_ids_of, vocab_hash_of
        size, stops = len(tokenizer.token_bytes), list(stop_ids_of(tokenizer))
        if self.meta.get("vocab_size") != size or self.meta.get("vocab_hash") != vocab_hash_of(tokenizer):
            raise ValueError(f"--grammar {self.path}: compiled for another tokenizer (--tokenizer): the file's has "
                             f"{self.meta.get('vocab_size')} tokens (hash {str(self.meta.get('vocab_hash'))[:12]}), "
                             f"this run's {size} (hash {str(vocab_hash_of(tokenizer))[:12]})")
        if _plain(self.meta.get("stop_ids")) != stops:
            raise ValueError(f"--grammar {self.path}: compiled for other stop tokens (--eos-id): the file's are "
                             f"{short(self.meta.get('stop_ids'), 40)}, this run's {short(stops, 40)}")


def _plain(x):
    """x as JSON gives it back (tuples become lists), for comparing with what a file recorded."""
    return json.loads(json.dumps(x))


def _tool_names(setting) -> list[str]:
    """The tool names of a registry key, either form: seed [[name, [args]], ...], call [{"name": ...}, ...]."""
    entries = setting[1] if isinstance(setting, list) and len(setting) == 2 and isinstance(setting[1], list) else []
    return [str(e[0]) if isinstance(e, list) and e else str(e.get("name")) if isinstance(e, dict) else "?"
            for e in entries]


def _cut(names: list[str], limit: int = 80) -> str:
    text = ", ".join(names) if names else "none recorded"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def schema_args(p):
    """The flags of the grammar's reading of typed tools' schemas (docs/json-schema.md); run/loading.py
    schema_options reads them."""
    p.add_argument("--schema-mode", choices=("lenient", "strict"), default="lenient",
                   help="what a schema keyword the grammar cannot write exactly (uniqueItems, not, an overlapping "
                        "oneOf, ...) does (default %(default)s): lenient compiles the nearest superset, warns once "
                        "per keyword and validates each finished call; strict refuses the tool file, naming keyword "
                        "and pointer")
    # default None, not False: a run without the flag keeps the fingerprint runs had before it existed
    p.add_argument("--open-objects", action="store_true", default=None,
                   help="read an object schema that says nothing of additionalProperties as the JSON Schema "
                        "specification does (other keys allowed, after the declared ones) instead of closed, as "
                        "OpenAI's strict function calling reads it")
