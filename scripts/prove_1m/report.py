"""The report: one markdown table for docs/performance.md (with its date / GPU / versions line)
and the failures that make the script exit 1."""
from __future__ import annotations

import functools
import json
import time

from prove_1m.common import FRAMEWORK_CALL, PASS_CALL, PASS_LABEL, TIE_TOL, passes_for

def _gib(b):
    return "n/a" if b is None else f"{b / 2 ** 30:.2f} GiB"


def _ms(t):
    return "n/a" if t is None else (f"{t:.1f} ms" if t < 1000 else f"{t / 1000:.2f} s")


def table(args, rows):
    """One markdown table: per release and pass, a row per context step (the unpatched function
    and sm12x side by side) and the full --keys."""
    head = (f"Indexer pass through the frameworks' own functions, one {args.queries}-row prefill chunk (the "
            f"last {args.queries} tokens of the context) and {args.decode_rows} decode rows, {args.heads} heads x "
            f"{args.dim}, top-{args.topk}. Keys are indexer keys: a token each for DeepSeek-V3.2 / GLM-5, four "
            f"tokens each for DeepSeek-V4's C4 indexer (262,144 keys: a 1M-token V4 prompt)"
            + (f", a pool of {args.index_kpool} tokens each for GLM-5-next (a context of K pools is "
               f"{args.index_kpool}K + {args.index_kpool - 1} tokens; its indices are the top-"
               f"{args.topk // args.index_kpool} pools' tokens plus the row's last incomplete pool)"
               if getattr(args, "glm5next", False) else "")
            + ". "
            "sm12x: every indexer top-k record applied; unpatched: those records "
            f"skipped ([rows, keys] logits from sm12x's DeepGEMM-surface kernels, then the framework's top-k). "
            f"Peak: most memory allocated during the pass above its inputs; time: median of {args.reps} calls "
            f"after a warm-up. The unpatched function steps up the context until a pass fails or passes the "
            f"{args.memory_cap_gib:g} GiB cap. Tied rows: index sets that differ only by keys within "
            f"{TIE_TOL:g} (relative) of the row's k-th reference score.")
    lines = [head, "",
             ("| framework function | pass | keys | unpatched peak | unpatched time | sm12x peak | sm12x time | "
              "peak ratio | speed-up | top-k calls on logits (unpatched / sm12x) | rows same / tied / wrong | "
              "unpatched step-up |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    failures = []
    by = {(r["release"], r["mode"], r["pass"], r["keys"]): r for r in rows}
    for release in args.release_list:
        for kind in passes_for(release, getattr(args, "v41", False), getattr(args, "glm5next", False),
                               getattr(args, "pass_list", ())):
            un = [r for r in rows if r["release"] == release and r["mode"] == "unpatched" and r["pass"] == kind]
            stop = next((r for r in un if not r["ok"]), None)
            shown = sorted({r["keys"] for r in rows if r["release"] == release and r["pass"] == kind} | {args.keys})
            for keys in shown:
                u = by.get((release, "unpatched", kind, keys))
                p = by.get((release, "patched", kind, keys))
                u_ok, p_ok = bool(u and u["ok"]), bool(p and p["ok"])
                if p is not None and not p_ok:
                    failures.append(f"{release} {kind} at {keys} keys (sm12x): {p['error']}")
                if stop is not None:
                    note = stop["error"] if keys == stop["keys"] else ""
                else:
                    note = "within the cap at every step" if un and keys == shown[-1] else ""
                if (u and "outcome" in u) or (p and "outcome" in p):  # a pass whose result is an outcome
                    note = (f"unpatched: {(u or {}).get('outcome', 'not run')}; "
                            f"sm12x: {(p or {}).get('outcome', 'not run')}")
                ratio = f"{u['peak'] / p['peak']:.1f}x" if u_ok and p_ok and u["peak"] and p["peak"] else ""
                speed = f"{u['ms'] / p['ms']:.2f}x" if u_ok and p_ok and u["ms"] and p["ms"] else ""
                check = f"{p['same']} / {p['ties']} / {p['wrong']}" if p_ok and "same" in p else ""
                calls = f"{u['logits_topk_calls'] if u_ok else '-'} / {p['logits_topk_calls'] if p_ok else '-'}"
                unpatched = (f"{_gib(u['peak'])} | {_ms(u['ms'])}" if u_ok
                             else f"{'failed' if u else 'not run'} | ")
                mine = f"{_gib(p['peak'])} | {_ms(p['ms'])}" if p_ok else f"{'FAILED' if p else 'not run'} | "
                call = PASS_CALL.get((release, kind), FRAMEWORK_CALL[release])
                lines.append(f"| {call} | {PASS_LABEL.get((release, kind), kind)} | {keys:,} | "
                             f"{unpatched} | {mine} | {ratio} | {speed} | {calls} | {check} | {note} |")
    for r in rows:
        # the V4.1 SGLang passes check both modes against the references: a wrong unpatched row fails too
        if r.get("ok") and r.get("wrong") and (r["mode"] == "patched" or r.get("checked") == "reference"):
            mode = "" if r["mode"] == "patched" else f" ({r['mode']})"
            failures.append(f"{r['release']} {r['pass']}{mode} at {r['keys']} keys: {r['wrong']} rows differ "
                            "beyond ties")
        if r["pass"] == "worker":
            failures.append(f"{r['release']} {r['mode']}: {r['error']}")
    return "\n".join(lines), failures


def report(args, rows):
    """The table (with its date / GPU / versions line) and the failures so far; written to
    ``--markdown`` and the rows to ``--json`` when given."""
    table_text, failures = table(args, rows)
    text = f"{time.strftime('%Y-%m-%d')}, {_versions(args.device)}\n\n{table_text}"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return text, failures


@functools.cache
def _versions(device):
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "CPU (interpreter)"
    return f"{gpu}, torch {torch.__version__}, triton {triton.__version__}"
