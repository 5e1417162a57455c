"""Benchmark: longitudinal annotation and progression-aware evaluation (`cxr_audit.longitudinal`) on SYNTHETIC demo
data.

Data: `make_demo_corpus(--patients)` (default 300 patients): the reference findings and all simulated generations.

Timed (wall clock, best of --repeat):
- rules_sentences_per_s: `RuleAnnotator().annotate` on the distinct sentences (a fresh annotator each time);
- llm_path_sentences_per_s: `LLMAnnotator(rule_chat(), cache=False).annotate` on the first --llm-n distinct sentences:
  the same rules behind the whole LLM machinery (prompts, `run_batch`, parsing), i.e. the overhead of that machinery;
- split_reports_per_s (pysbd, the default) and split_reports_per_s_regex: `report_sentences` on all reports;
- evaluate_s: `progression_evaluation` (progression measures only, sentences given) with --reps paired replicates,
  against the evaluator practice of recomputing progression micro-F1 from the instance table on every resample
  (the resampled studies' rows gathered and counted with numpy; micro-F1 only; --naive-reps replicates timed, scaled).
  Both use the same resamples
  (`cxr_audit.stats.resample_indices`, same seed); `identical` says whether their micro-F1 replicates agree exactly.
Writes benchmarks/results/longitudinal.json and prints it. No assertions on time.
Run: .venv/bin/python benchmarks/bench_longitudinal.py [--patients 300] [--reps 1000]
"""
import platform
import time

import numpy as np

from _timing import best_of, options, write_result
from cxr_audit.longitudinal import LLMAnnotator, RuleAnnotator, annotate_reports, report_sentences, rule_chat
from cxr_audit.longitudinal_eval import progression_evaluation
from cxr_audit.stats import resample_indices
from cxr_audit.synth import make_demo_corpus


def naive_micro_f1(instances, units, system, idx):
    """Per resample: gather the resampled studies' instance rows and recompute micro F1 with numpy (the evaluator
    practice)."""
    d = instances[instances.system == system]
    ref, pred = d.reference.to_numpy(), d.predicted.to_numpy()
    pos = {u: i for i, u in enumerate(units)}
    rows = [[] for _ in units]
    for r, u in enumerate(d.study_id): rows[pos[u]].append(r)
    rows = [np.array(r, dtype=int) for r in rows]
    out = []
    for draw in idx:
        k = np.concatenate([rows[i] for i in draw])
        hit, absent = ref[k] == pred[k], pred[k] == "absent"
        tp, fp, fn = hit.sum(), (~hit & ~absent).sum(), (~hit).sum()
        out.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else np.nan)
    return np.array(out)


def main():
    a = options(__doc__.splitlines()[0], patients=300, reps=1000, naive_reps=200, llm_n=2000, split_n=2000, repeat=3)
    demo = make_demo_corpus(a.patients, seed=0)
    reports = {**dict(zip(demo.studies.study_id, demo.studies.findings)),
               **dict(zip(demo.generations.sample_id, demo.generations.hypothesis))}
    sents = report_sentences(reports, splitter="regex")
    uniq = sents.sentence.unique().tolist()
    res = {"patients": a.patients, "reports": len(reports), "sentences": len(sents), "distinct_sentences": len(uniq)}

    t = best_of(lambda: RuleAnnotator().annotate(uniq), a.repeat)
    res["rules_sentences_per_s"] = len(uniq) / t
    sub = uniq[:a.llm_n]
    t_llm = best_of(lambda: LLMAnnotator(rule_chat(), cache=False).annotate(sub), max(1, a.repeat // 2))
    t_rules_sub = best_of(lambda: RuleAnnotator().annotate(sub), a.repeat)
    res.update(llm_path_sentences=len(sub), llm_path_sentences_per_s=len(sub) / t_llm,
               llm_path_overhead=t_llm / t_rules_sub)

    some = dict(list(reports.items())[:a.split_n])
    res["split_reports_per_s"] = len(some) / best_of(lambda: report_sentences(some), 1)
    res["split_reports_per_s_regex"] = len(some) / best_of(lambda: report_sentences(some, splitter="regex"), a.repeat)

    ref = annotate_reports(dict(zip(demo.studies.study_id, demo.studies.findings)), splitter="regex")
    gen = annotate_reports(dict(zip(demo.generations.sample_id, demo.generations.hypothesis)), splitter="regex")
    run = lambda: progression_evaluation(demo.studies, demo.generations, metrics=(), reps=a.reps, seed=1,
                                         reference_sentences=ref, generated_sentences=gen)
    ev = run()
    t_ev = best_of(run, a.repeat)
    units = list(ev.units)
    idx = resample_indices(len(units), a.reps, seed=1)
    t0 = time.perf_counter()
    naive = {s: naive_micro_f1(ev.instances, units, s, idx[:a.naive_reps]) for s in ev.systems}
    t_naive = (time.perf_counter() - t0) * a.reps / a.naive_reps
    ours = {s: ev.results["progression_micro_f1"].result(s).replicates[:a.naive_reps] for s in ev.systems}
    res.update(units=len(units), systems=len(ev.systems), measures=len(ev.results), reps=a.reps, evaluate_s=t_ev,
               naive_micro_f1_only_s_scaled=t_naive, speedup=t_naive / t_ev,
               identical=all(np.allclose(ours[s], naive[s], rtol=0, atol=1e-12, equal_nan=True) for s in ev.systems),
               python=platform.python_version(), machine=platform.machine())
    write_result("longitudinal", res)


if __name__ == "__main__":
    main()
