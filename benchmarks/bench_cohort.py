"""Benchmark: paper 004's MIMIC-CXR cohort recipe (`recipe_004_mimic`) on a 400,000-image synthetic metadata table.

The synthetic table has MIMIC-CXR's shape: one row per study (about 228,000 studies of 65,000 patients)
with per-image lists (`image_paths`, `image_views`, `dicom_ids`, `metadata_rows`), as
`cxr_audit.corpus.load_mimic_cxr` returns them, about 1.4% of the images in the official test split, and
report texts assembled from a sentence pool (about 1% of them too short to pass the 32-character rule).

Timed (best of --repeat runs):
- ours_s: `recipe_004_mimic(studies)` and materialising its `.studies` and `.flow` (target <= 5 s);
- ours_with_excluded_s: the same plus materialising `.excluded` (the ~226,000 removed rows);
- baseline_s: a straightforward pandas row-wise implementation of the same recipe (iterrows over
  studies, a Python list of image entries sorted by metadata row, per-entry view check and text cleaning,
  first 401), measured once in the same run; the script checks that both select the same 401 entries;
- ours_all_test_s (stress, no baseline): every study in the test split, so all 400,000 images reach the
  view and text rules.
Writes benchmarks/results/cohort.json and prints it. No assertions on time.
Run: .venv/bin/python benchmarks/bench_cohort.py [--images N] [--repeat R]
"""
import os
import platform
import random
import time

import numpy as np
import pandas as pd

from _timing import options, timed, write_result
from cxr_audit.cohort import MIMIC_004_VIEWS, recipe_004_mimic
from cxr_audit.reports import clean_report_mimic

FINDINGS = ["The lungs are clear.", "There is no focal consolidation.", "No pleural effusion or pneumothorax.",
            "Heart size is normal.", "The cardiomediastinal silhouette is within normal limits.",
            "Mild pulmonary vascular congestion.", "Small left pleural effusion.", "Moderate right pleural effusion.",
            "Bibasilar atelectasis.", "Left lower lobe opacity may reflect pneumonia.",
            "Endotracheal tube terminates 4 cm above the carina.", "Enteric tube courses below the diaphragm.",
            "Right internal jugular line ends in the SVC.", "Stable cardiomegaly.",
            "Mild interstitial edema.", "No acute osseous abnormality.", "Healed right rib fractures.",
            "Hiatal hernia.", "Elevated right hemidiaphragm.", "Calcified granuloma in the right upper lobe.",
            "Sternotomy wires are intact.",
            "Median sternotomy and CABG clips.", "Pacemaker leads in the right atrium and ventricle.",
            "Degenerative changes of the spine.", "Lung volumes are low.", "Hyperinflated lungs.",
            "Patchy opacities in both lung bases.", "Interval improvement of the effusion.",
            "No change since the prior study.", "Increased opacity at the right base.", "Tortuous aorta.",
            "Aortic knob calcification."]
IMPRESSIONS = ["No acute cardiopulmonary process.", "Possible early pneumonia.", "Small bilateral effusions.",
               "Lines and tubes as described.", "Mild pulmonary edema.", "Cardiomegaly without edema.",
               "Improving left basilar opacity.", "Worsening right effusion.", "No pneumothorax.",
               "Atelectasis at the bases."]
VIEWS = np.array(["PA", "AP", "LATERAL", "LL", "AP AXIAL", None], dtype=object)
VIEW_P = [0.28, 0.40, 0.25, 0.04, 0.005, 0.025]


def make_studies(n_images: int, seed: int = 0, test_share: float = 0.014) -> pd.DataFrame:
    "A MIMIC-shaped SYNTHETIC studies table with about `n_images` images."
    g = np.random.default_rng(seed)
    per_study = g.choice([1, 2, 3], size=n_images, p=[0.35, 0.55, 0.10])
    per_study = per_study[: int(np.searchsorted(np.cumsum(per_study), n_images)) + 1]
    per_study[-1] -= int(per_study.sum()) - n_images
    n_studies = len(per_study)
    per_patient = g.geometric(1 / 3.5, size=n_studies)
    patient = np.repeat(np.arange(n_studies), per_patient)[:n_studies]
    n_patients = patient.max() + 1
    split_of_patient = g.choice(np.array(["train", "validate", "test"], dtype=object), size=n_patients,
                                p=[1 - 0.008 - test_share, 0.008, test_share])
    starts = np.cumsum(per_study) - per_study
    views = g.choice(VIEWS, size=n_images, p=VIEW_P)
    tags, short = g.integers(1 << 30, size=n_images), g.random(n_studies) < 0.01
    pick = random.Random(seed)          # a private generator: fast sampling of sentences, no global state
    rows = []
    for s in range(n_studies):
        k, a = int(per_study[s]), int(starts[s])
        sid, pid = f"s{50000000 + s}", f"p{10000000 + int(patient[s])}"
        dicoms = [f"{s:08x}-{j:04x}-{tags[a + j]:08x}" for j in range(k)]
        if short[s]: findings, impression = "", pick.choice(["Normal.", "Clear.", ""])
        else:
            findings = " ".join(pick.sample(FINDINGS, pick.randint(2, 7)))
            impression = " ".join(pick.sample(IMPRESSIONS, pick.randint(1, 2)))
        rows.append({"study_id": sid, "patient_id": pid, "split": split_of_patient[patient[s]],
                     "image_paths": [f"files/{pid[:3]}/{pid}/{sid}/{d}.jpg" for d in dicoms],
                     "image_views": list(views[a:a + k]), "dicom_ids": dicoms, "metadata_rows": list(range(a, a + k)),
                     "findings": findings, "impression": impression,
                     "text": f"FINDINGS: {findings}\nIMPRESSION: {impression}"})
    df = pd.DataFrame(rows)
    df.insert(2, "dataset", "mimic-cxr")
    df["view"] = [v[0] for v in df["image_views"]]
    df["study_time"] = pd.Timestamp("2150-01-01") + pd.to_timedelta(g.integers(0, 10 * 365 * 86400, n_studies),
                                                                    unit="s")
    for c in ("indication", "comparison", "technique"): df[c] = ""
    df["restricted"] = True
    return df


def baseline(studies: pd.DataFrame, n: int = 401, min_text: int = 32) -> tuple[list[str], list[int]]:
    "A straightforward pandas row-wise implementation of the recipe: entry IDs and the flow counts."
    test = []
    for _, r in studies.iterrows():
        if r["split"] == "test": test.append(r)
    entries = []
    for r in test:
        for p, v, d, m in zip(r["image_paths"], r["image_views"], r["dicom_ids"], r["metadata_rows"]):
            entries.append({**r.to_dict(), "image_path": p, "image_view": v, "dicom_id": d, "metadata_row": m,
                            "entry_id": f"{r['study_id']}/{d}"})
    entries.sort(key=lambda e: e["metadata_row"])
    frontal = [e for e in entries if e["image_view"] in MIMIC_004_VIEWS]
    texts = [" ".join(t for t in (e["impression"].strip(), e["findings"].strip()) if t) for e in frontal]
    eligible = [e for e, t in zip(frontal, texts) if len(clean_report_mimic(t)) >= min_text]
    cohort = pd.DataFrame(eligible[:n])
    counts = [len(test), len(entries), len(frontal), len(eligible), len(cohort)]
    return cohort["entry_id"].tolist(), counts


def ours(studies: pd.DataFrame, excluded: bool = False):
    c = recipe_004_mimic(studies)
    c.studies, c.flow
    if excluded: c.excluded
    return c


def main():
    a = options(images=400_000, repeat=3)
    t = time.perf_counter(); studies = make_studies(a.images); build_s = time.perf_counter() - t
    ours(studies.head(2000))                      # warm-up (imports, compiled regexes)
    ours_s, c = timed(lambda: ours(studies), a.repeat)
    ours_ex_s, _ = timed(lambda: ours(studies, excluded=True), a.repeat)
    t = time.perf_counter(); base_ids, base_counts = baseline(studies); base_s = time.perf_counter() - t
    flow = c.flow
    same = base_ids == c.studies["entry_id"].tolist() and base_counts == [int(flow.n_out[0])] + flow.n_out[1:].tolist()
    stress_s, cs = timed(lambda: ours(studies.assign(split="test")), 1)
    res = {"images": int(sum(map(len, studies["image_paths"]))), "studies": len(studies),
           "patients": int(studies["patient_id"].nunique()), "build_table_s": round(build_s, 2),
           "ours_s": round(ours_s, 3), "ours_with_excluded_s": round(ours_ex_s, 3), "baseline_s": round(base_s, 3),
           "baseline": "pandas iterrows + Python list of entries + per-entry clean_report_mimic",
           "ratio_baseline_over_ours": round(base_s / ours_s, 1), "same_result_as_baseline": bool(same),
           "flow_n_out": flow.n_out.tolist(), "cohort_studies": int(flow.n_studies.iloc[-1]),
           "ours_all_test_s": round(stress_s, 3), "all_test_flow_n_out": cs.flow.n_out.tolist(),
           "target_s": 5.0, "repeat": a.repeat, "python": platform.python_version(), "cpus": os.cpu_count()}
    write_result("cohort", res)


if __name__ == "__main__":
    main()
