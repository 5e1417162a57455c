"""Benchmark: the CheXpert-14 labeler (`cxr_audit.labels`) on 20,000 SYNTHETIC demo reports, on one CPU core.

Reports: the reference texts (findings + impression) and the generated reports of `make_demo_corpus`, first 20,000.
The process is pinned to one core (`os.sched_setaffinity`, where the OS has it).

Timed:
- reports_per_s: `Labeler()` (the default: regex sentence splitter, sentence cache) on all reports, cache cold at start
  (target >= 2,000 reports/s);
- reports_per_s_no_cache: the same with `cache_size=0` (every sentence labeled afresh);
- reports_per_s_pysbd: the default labeler with pysbd sentence splitting, on the first 2,000 reports;
- label_audit_s: the one-call `label_audit` on the demo corpus of --audit-patients patients (five runs, ground truth,
  the naive contrast labeler, 200 resamples), including its bootstrap tables (`to_frame()`, `exclusion`).

medspacy (optional cross-check): the script creates a separate virtual environment under
benchmarks/results/.medspacy-venv (gitignored; medspacy pins numpy<2, so it never enters the project's environment),
installs medspacy there with pip (at most --medspacy-timeout seconds), and runs medspacy's own ConText pipeline
(PyRuSH sentences, its default ConText rules) with our phrase bank's `mention` and `uncertain` patterns as target
rules, on the first --medspacy-n reports. Mention states are aggregated as ours are (1 > -1 > 0 > blank; No Finding
when no observation but Support Devices is 1 or -1). Reported: medspacy_reports_per_s, speedup (ours / medspacy on
the same reports, our cache cold), agreement (share of equal raw states over report x 14 labels) and
agreement_binary (only 1 positive). When medspacy cannot be installed or run, `medspacy_error` says why.
Writes benchmarks/results/labels.json and prints it. No assertions on time.
Run: .venv/bin/python benchmarks/bench_labels.py [--n 20000] [--audit-patients 60] [--medspacy-n 5000] [--no-medspacy]
"""
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from _timing import RESULTS, options, write_result
from cxr_audit.labels import CHEXPERT_14, Labeler, phrase_table, to_wide
from cxr_audit.label_audit import label_audit, reference_texts
from cxr_audit.synth import make_demo_corpus

VENV = RESULTS / ".medspacy-venv"

MEDSPACY_SCRIPT = r'''
import json, sys, time
from loguru import logger
logger.remove()
import medspacy
from medspacy.target_matcher import TargetRule
rules, texts = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
nlp = medspacy.load()
nlp.get_pipe("medspacy_target_matcher").add([TargetRule(f"{r['label']}#{i}", r["label"], pattern=r["pattern"],
                                                        attributes=r.get("attributes"))
                                             for i, r in enumerate(rules)])
t = time.perf_counter()
out = []
for doc in nlp.pipe(texts, batch_size=256):
    out.append([[e.label_, bool(e._.is_negated), bool(e._.is_uncertain or e._.is_hypothetical), e.text]
                for e in doc.ents])
dt = time.perf_counter() - t
json.dump({"seconds": dt, "ents": out, "medspacy": medspacy.__version__}, open(sys.argv[3], "w"))
'''


def pin_one_core():
    if hasattr(os, "sched_setaffinity"):
        cpu = sorted(os.sched_getaffinity(0))[0]
        os.sched_setaffinity(0, {cpu})
        return cpu
    return None


def demo_reports(n: int) -> list[str]:
    patients, texts = 200, []
    while len(texts) < n:
        patients *= 2
        d = make_demo_corpus(patients, seed=0)
        texts = list(reference_texts(d.studies)) + list(d.generations.hypothesis)
    return texts[:n]


def time_labeler(lab: Labeler, texts) -> tuple[float, pd.DataFrame]:
    t = time.perf_counter()
    out = lab(texts)
    return len(texts) / (time.perf_counter() - t), out


def ensure_medspacy(timeout: int) -> Path:
    py = VENV / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import medspacy"], capture_output=True).returncode == 0: return py
    subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True, capture_output=True, timeout=120)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "medspacy"], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0: raise RuntimeError(f"pip install medspacy failed: {r.stderr.strip()[-500:]}")
    return py


def medspacy_rules() -> list[dict]:
    "Our phrase bank's mention and uncertain patterns as medspacy target rules."
    pt = phrase_table(kinds=("mention", "uncertain"))
    pt = pt[pt.observation.isin(CHEXPERT_14)]
    return [{"label": r.observation, "pattern": rf"(?i)\b(?:{r.regex})\b",
             **({"attributes": {"is_uncertain": True}} if r.kind == "uncertain" else {})} for r in pt.itertuples()]


def medspacy_states(ents: list) -> pd.DataFrame:
    rank = {1.0: 3, -1.0: 2, 0.0: 1}
    rows = []
    for doc in ents:
        best = {}
        for label, neg, unc, _ in doc:
            s = 0.0 if neg else -1.0 if unc else 1.0
            if label not in best or rank[s] > rank[best[label]]: best[label] = s
        if not any(v != 0.0 for k, v in best.items() if k != "Support Devices"): best["No Finding"] = 1.0
        rows.append(best)
    return pd.DataFrame(rows, columns=list(CHEXPERT_14)).astype("float64")


def run_medspacy(texts, ours_wide: pd.DataFrame, timeout: int) -> dict:
    t0 = time.perf_counter()
    py = ensure_medspacy(timeout)
    install_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "rules.json").write_text(json.dumps(medspacy_rules()))
        (d / "texts.json").write_text(json.dumps([t if isinstance(t, str) else "" for t in texts]))
        (d / "run.py").write_text(MEDSPACY_SCRIPT)
        r = subprocess.run([py, d / "run.py", d / "rules.json", d / "texts.json", d / "out.json"], capture_output=True,
                           text=True, timeout=1800)
        if r.returncode != 0: raise RuntimeError(f"medspacy run failed: {r.stderr.strip()[-800:]}")
        res = json.loads((d / "out.json").read_text())
    ms = medspacy_states(res["ents"])
    a, b = ours_wide.reset_index(drop=True).to_numpy(float), ms.to_numpy(float)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return {"medspacy_version": res["medspacy"], "medspacy_setup_s": round(install_s, 1),
            "medspacy_reports_per_s": round(len(texts) / res["seconds"], 1), "agreement": round(float(same.mean()), 4),
            "agreement_binary": round(float(((a == 1) == (b == 1)).mean()), 4),
            "agreement_by_label": {l: round(float(same[:, i].mean()), 4) for i, l in enumerate(CHEXPERT_14)}}


def time_label_audit(patients: int) -> tuple[float, int]:
    "Seconds for `label_audit` with its bootstrap tables, and the number of generated reports."
    d = make_demo_corpus(patients, seed=0)
    t = time.perf_counter()
    audit = label_audit(d.studies, d.generations, d.findings, reps=200, seed=2026, contrast="naive")
    audit.to_frame(); audit.exclusion
    return time.perf_counter() - t, len(d.generations)


def main():
    args = options(n=20000, medspacy_n=5000, medspacy_timeout=480, no_medspacy=False, audit_patients=60)
    cpu = pin_one_core()
    texts = demo_reports(args.n)
    Labeler()(["warm up the imports."])
    rps, out = time_labeler(Labeler(), texts)
    rps_nc, out_nc = time_labeler(Labeler(cache_size=0), texts)
    assert out.equals(out_nc)
    rps_sbd, _ = time_labeler(Labeler(splitter="default"), texts[:2000])
    audit_s, audit_reports = time_label_audit(args.audit_patients)
    res = {"benchmark": "labels", "reports": len(texts), "one_core": cpu is not None, "cpu": cpu,
           "reports_per_s": round(rps, 1), "reports_per_s_no_cache": round(rps_nc, 1),
           "reports_per_s_pysbd": round(rps_sbd, 1), "label_audit_s": round(audit_s, 2),
           "label_audit_generated_reports": audit_reports,
           "target_reports_per_s": 2000, "meets_target": rps >= 2000,
           "mean_words": round(float(np.mean([len(t.split()) for t in texts])), 1),
           "python": platform.python_version(), "machine": platform.machine()}
    if args.no_medspacy: res["medspacy_error"] = "skipped (--no-medspacy)"
    else:
        sub = texts[:args.medspacy_n]
        try:
            ours_sub, wide = time_labeler(Labeler(), sub)
            res.update({"medspacy_n": len(sub), "reports_per_s_same_reports": round(ours_sub, 1)})
            ms = run_medspacy(sub, to_wide(wide), args.medspacy_timeout)
            res.update(ms)
            res["speedup"] = round(ours_sub / ms["medspacy_reports_per_s"], 2)
        except Exception as e:  # record why, never fail the benchmark for the optional cross-check
            res["medspacy_error"] = f"{type(e).__name__}: {e}"[:1000]
    write_result("labels", res)


if __name__ == "__main__":
    main()
