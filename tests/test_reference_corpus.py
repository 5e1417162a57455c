"""The reference-corpus audit on real IU X-ray reports and through the command line (no mock)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from cxr_audit.corpus import load_rexrank
from cxr_audit.labels import get_labeler, to_wide
from cxr_audit.reference_corpus import audit_reference_corpus

IU = Path(__file__).parent / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json"


def test_real_iu_references_counted_as_pandas_counts_them():
    st = load_rexrank(IU, "iu-xray")
    ra = audit_reference_corpus(st, "findings")
    f = st.findings[st.findings.str.strip() != ""]
    norm = f.map(lambda t: " ".join(t.lower().split()).rstrip(".,;:!? \t"))
    v = ra.summary().set_index("measure")["value"]
    assert v["reports"] == len(st) and v["empty"] == len(st) - len(f)
    assert v["unique_report_ratio"] == norm.nunique() / len(f)
    assert v["top_5_share"] == norm.value_counts().head(5).sum() / len(f)
    # label shares weight each distinct text by its count: the same as labeling every report
    wide = to_wide(get_labeler("chexpert")(f.tolist(), ids=list(range(len(f)))))
    assert np.isclose(v["no_finding_share"], (wide["No Finding"] == 1).mean())
    assert ra.labels.labeler.unique().tolist() == ["cxr_audit:chexpert"]


def test_cli_reads_one_column_of_a_parquet_file(tmp_path):
    exe = str(Path(sys.executable).parent / "cxr-audit")
    st = load_rexrank(IU, "iu-xray")
    st[["study_id", "findings", "impression"]].to_parquet(tmp_path / "refs.parquet")
    r = subprocess.run([exe, "reference-corpus", tmp_path / "refs.parquet", "--out", tmp_path / "o", "--column",
                        "impression", "--labeler", "none"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "reference-corpus:" in r.stdout and "distinct" in r.stdout, r.stderr
    summary = pd.read_csv(tmp_path / "o" / "summary.csv").set_index("measure")["value"]
    assert summary["reports"] == len(st) and not (tmp_path / "o" / "labels.csv").exists()
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["params"]["column"] == "impression"
    bad = subprocess.run([exe, "reference-corpus", tmp_path / "refs.parquet", "--out", tmp_path / "x", "--column",
                          "text"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no column 'text'" in bad.stderr and "Traceback" not in bad.stderr
