"""Benchmark: the overhead of cxr_audit.generate's plumbing around Hugging Face `generate`, on the tiny ViT+GPT-2 model.

The tiny model (built offline from configs) makes the model itself cheap, so the numbers show what the wrapper adds
(our timings include reading and preprocessing the PNG files and a processor that suppresses the end token):
- hf_sample_s: baseline, `model.generate(do_sample=True, top_k=50, ...)` on preprocessed pixel values (global RNG);
- ours_sample_s: `HFReportGenerator.generate_batch` under K50 with per-row seeded sampling (image loading included);
- hf_greedy_s / ours_greedy_s: the same for greedy decoding (G1);
- ours_anti_template_s: greedy with all four anti-template processors (packaged phrase list);
- ours_sample_batch1_s: K50 with batch size 1 (what per-sample seeding saves you from having to do).
Each is the best of --repeat runs over --n images, capped at --tokens new tokens with the end token suppressed
(so every run does the same number of steps). Ratios are against the baseline measured in the same run.
Writes benchmarks/results/generate.json and prints it. No assertions on time.
Run: .venv/bin/python benchmarks/bench_generate.py [--n 16] [--tokens 48] [--repeat 3] [--threads 1]
"""
import dataclasses
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from cxr_audit.generate import (POLICIES, EarlyEOSSuppression, EOSReweight, HFReportGenerator, RecurrencePenalty,
                                TemplatePhrasePenalty, load_image, tiny_model)
from _timing import best_of, options, write_result


def main():
    a = options(n=16, tokens=48, repeat=3, threads=1)
    torch.set_num_threads(a.threads)
    tiny = tiny_model("encoder-decoder")
    model, proc = tiny.model, tiny.processor
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i in range(a.n):
            p = Path(d) / f"{i}.png"
            Image.fromarray(np.random.default_rng(i).integers(0, 255, (224, 224, 3), dtype=np.uint8)).save(p)
            paths.append(str(p))
        pv = proc.image_processor([load_image(p) for p in paths], return_tensors="pt")["pixel_values"]
        never = (EOSReweight(1e-9),)
        pol = {k: dataclasses.replace(POLICIES[k], max_new_tokens=a.tokens, processors=never) for k in ("G1", "K50")}
        anti = dataclasses.replace(pol["G1"], name="G1-anti",
                                   processors=never + (TemplatePhrasePenalty(), RecurrencePenalty(),
                                                                                 EarlyEOSSuppression(min_tokens=8)))
        gen, gen1 = HFReportGenerator(model, proc, batch_size=a.n), HFReportGenerator(model, proc, batch_size=1)
        raw = lambda **kw: model.generate(pixel_values=pv, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                                          pad_token_id=0, eos_token_id=3, **kw)
        gen.generate_batch(paths[:2], policy=pol["G1"])  # warm up
        res = {
            "hf_greedy_s": best_of(lambda: raw(do_sample=False, repetition_penalty=1.15), a.repeat),
            "ours_greedy_s": best_of(lambda: gen.generate_batch(paths, policy=pol["G1"]), a.repeat),
            "ours_anti_template_s": best_of(lambda: gen.generate_batch(paths, policy=anti), a.repeat),
            "hf_sample_s": best_of(lambda: raw(do_sample=True, top_k=50, repetition_penalty=1.05), a.repeat),
            "ours_sample_s": best_of(lambda: gen.generate_batch(paths, policy=pol["K50"], seeds=range(a.n)), a.repeat),
            "ours_sample_batch1_s": best_of(lambda: gen1.generate_batch(paths, policy=pol["K50"], seeds=range(a.n)), 1),
        }
    res.update({
        "ratio_greedy_vs_hf": res["ours_greedy_s"] / res["hf_greedy_s"],
        "ratio_anti_template_vs_greedy": res["ours_anti_template_s"] / res["ours_greedy_s"],
        "ratio_seeded_sample_vs_hf_sample": res["ours_sample_s"] / res["hf_sample_s"],
        "ratio_batch1_vs_batched_sample": res["ours_sample_batch1_s"] / res["ours_sample_s"],
        "n_images": a.n, "new_tokens": a.tokens, "repeat": a.repeat, "threads": a.threads,
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
    })
    write_result("generate", res)


if __name__ == "__main__":
    main()
