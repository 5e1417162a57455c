"""Issue 22, long texts: linear-time sentence splitting and metric tokenisation, METEOR on texts its JVM cannot
take, and review sheets that neither run formulas nor cut reports silently.
Texts are made by repeating the real IU X-ray reports of fixtures/iu_real (a looping generation repeats its
sentences the same way); METEOR runs the real jar with Java."""
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from cxr_audit.meteor import METEOR_MAX_TOKENS, run_meteor
from cxr_audit.metrics import Meteor, tokenizer
from cxr_audit import reports
from cxr_audit.reports import split_sentences

IU = json.loads((Path(__file__).parent / "fixtures" / "iu_real" / "iu_valid_rexrank_sample.json").read_text("utf-8"))
MB = 1_000_000


def long_text(field: str = "report", sep: str = " ", n: int = MB) -> str:
    "`n` characters of the fixture's real `field` texts, repeated."
    base = sep.join(v[field] for v in IU.values() if v[field])
    return (base * (n // len(base) + 1))[:n]


TIMED_SPLIT = """
import json, sys, time
from cxr_audit import reports
from cxr_audit.reports import split_sentences
text, splitter = open(sys.argv[1]).read(), sys.argv[2]
split_sentences("Lungs clear. Heart normal.", splitter=splitter)   # imports and first use out of the timing
t = time.process_time(); n = len(split_sentences(text, splitter=splitter))   # CPU time: the test machine is shared
print(json.dumps({"seconds": time.process_time() - t, "sentences": n}))
"""


@pytest.mark.parametrize("splitter", ["regex", "pysbd", "default"])
@pytest.mark.parametrize("field", ["report", "section_findings"])
def test_split_sentences_1mb_finishes(tmp_path, splitter, field):
    # section_findings has no headers: the whole MB is one segment (pysbd took 63 s on 100 KB of it, minutes on 1 MB, as
    # the
    # old quadratic code did); run in a child so that such code fails by the 60 s limit instead of hanging the suite. No
    # assertion on the time (the machine is shared: ~0.5 s of CPU, 1.05 s once on a busy run): what keeps it linear is
    # checked below, and the CPU time is in the message
    f = tmp_path / "long.txt"; f.write_text(long_text(field), encoding="utf-8")
    out = subprocess.run([sys.executable, "-c", TIMED_SPLIT, str(f), splitter], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["sentences"] > 15_000, r


@pytest.mark.parametrize("field", ["report", "section_findings"])
def test_no_splitter_call_sees_more_than_the_long_segment_limit(field):
    # the linear bound: a long segment is cut at its sentence ends first, so the splitter (pysbd's cost grows with the
    # square
    # of its input) is only ever given pieces of at most `_LONG_SEGMENT` characters; a piece still longer is kept whole
    seen = []
    def spy(piece):
        seen.append(len(piece)); return [piece]
    text = long_text(field, n=100_000)
    out = split_sentences(text, splitter=spy)
    assert len(seen) > 100 and max(seen) <= reports._LONG_SEGMENT
    assert "".join(out).replace(" ", "") == "".join(split_sentences(text, splitter="regex")).replace(" ", "")


@pytest.mark.parametrize("splitter", ["regex", "pysbd"])
def test_long_text_splits_as_its_reports(splitter):
    # the long-text path gives the same sentences as splitting each real report alone
    texts = [v["section_findings"] for v in IU.values() if v["section_findings"]]
    joined = split_sentences(" ".join(texts), splitter=splitter)
    assert len(" ".join(texts)) > 1_000          # long enough to take the long-segment path
    assert joined == [s for t in texts for s in split_sentences(t, splitter=splitter)]


@pytest.mark.parametrize("text", [". " * 500_000, "a " * 500_000, "Dr. " * 250_000, "X" * MB])
def test_pathological_1mb_texts_finish(text):
    # no sentence end (a run-on) or only abbreviations: kept whole instead of going to pysbd in one piece
    out = split_sentences(text, splitter="pysbd")
    assert sum(map(len, out)) <= len(text)
    assert out


def test_split_sentences_normal_reports_unchanged():
    # real fixture reports never reach the long-text path: every segment goes whole to the splitter, as before
    # (checked when this was written: all 400 splits of these reports equal the splits of the previous code)
    from cxr_audit.reports import pysbd_splitter
    seen = []
    def spy(seg): seen.append(seg); return pysbd_splitter(seg)
    for v in IU.values():
        for field in ("report", "section_findings", "section_impression", "context"):
            assert split_sentences(v[field] or "", splitter=spy) == split_sentences(v[field] or "", splitter="pysbd")
    assert seen and max(map(len, seen)) < 1_000
    assert split_sentences(IU["CXR2279_IM-0865"]["report"], splitter="pysbd")[:3] == [
        "Heart size is enlarged.", "The aorta is unfolded.", "Otherwise the mediastinal contour is normal."]


@pytest.mark.parametrize("name", ["r2gen", "r2gen_iu"])
def test_metric_tokenisation_1mb_linear(name):
    # ten times the text takes about ten times the CPU, not a hundred: a ratio within one run (the best of three of
    # each, as the machine is shared), never an absolute time
    import time
    text, tok = long_text(sep="\n"), tokenizer(name)
    assert len(tok(text)) > 0.9 * MB
    def cpu(t: str) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time(); tok(t); best = min(best, time.process_time() - t0)
        return best
    assert cpu(text) < 20 * cpu(text[: MB // 10]) + 0.2


needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="METEOR needs Java on PATH")


@needs_java
def test_meteor_1mb_hypothesis_is_capped_not_a_crash():
    # a 1 MB hypothesis killed the JVM (OutOfMemoryError); now it is cut to METEOR_MAX_TOKENS tokens and flagged
    t = tokenizer("r2gen_iu")
    refs = [t(v["report"]) for v in list(IU.values())[:3]]
    hyps = [t(v["report"]) for v in list(IU.values())[1:4]]
    huge = t(long_text())
    assert len(huge.split()) > 100 * METEOR_MAX_TOKENS
    run = run_meteor(refs + [refs[0]], hyps + [huge])
    assert run.capped.tolist() == [False, False, False, True]
    plain = run_meteor(refs, hyps, max_tokens=None)           # normal inputs: the same statistics as without a cap
    np.testing.assert_array_equal(run.stats[:3], plain.stats)
    assert plain.capped.tolist() == [False] * 3
    # the jar saw the first 1,000 (its -norm splits a few more)
    assert METEOR_MAX_TOKENS <= run.stats[3][0] < 1.05 * METEOR_MAX_TOKENS


@needs_java
def test_meteor_metric_warns_naming_capped_rows():
    m = Meteor(max_tokens=5)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = m.stats(["the heart is normal .", "no acute process ."], ["no acute process .", "a b c d e f g h i ."])
    assert s.shape == (2, 23)
    msgs = [str(x.message) for x in w if "METEOR" in str(x.message)]
    assert len(msgs) == 1 and "1 pair(s)" in msgs[0] and "rows [1]" in msgs[0] and "5 tokens" in msgs[0]


# --- review sheets ------------------------------------------------------------------------------------------------

def hostile_demo():
    """The demo corpus with study IDs and a system name a spreadsheet would read as formulas, and one 40,000-character
    report."""
    from cxr_audit.synth import make_demo_corpus
    demo = make_demo_corpus(12, seed=4)
    studies = demo.studies.assign(study_id="@" + demo.studies.study_id)
    gens = demo.generations.assign(study_id="@" + demo.generations.study_id,
                                   system=demo.generations.system.str.replace("sim-template", "=cmd", regex=False))
    gens.loc[gens.index[0], "hypothesis"] = "No acute process. " * 2_300     # 41,400 characters
    return studies, gens


def test_review_key_is_formula_neutralised(tmp_path):
    import csv
    from cxr_audit.review import make_review_packets, sample_cases
    studies, gens = hostile_demo()
    cases = sample_cases(studies[["study_id", "dataset"]], 2, seed=2026, strata="dataset")
    P = make_review_packets(cases, gens, studies, seed=2026, out_dir=tmp_path)
    with open(tmp_path / "key" / "review_key.csv", newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["study_id"].startswith("'@") for r in rows)
    assert any(r["system"] == "'=cmd" for r in rows)
    assert not any(v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values())
    # writing the same packets again is still allowed (the folder's key is compared in its neutralised form)
    make_review_packets(cases, gens, studies, seed=2026, out_dir=tmp_path)
    assert P.key.study_id.str.startswith("@").all()              # the in-memory key keeps the real IDs


def test_xlsx_cut_at_excel_cell_limit_is_flagged(tmp_path):
    import openpyxl
    from cxr_audit.sheets import XLSX_CELL_LIMIT, XLSX_CUT_NOTE
    from cxr_audit.review import prepare_review
    studies, gens = hostile_demo()
    long_id = gens.study_id.iloc[0]
    with pytest.warns(UserWarning, match=r"cell limit were cut in R\d_phase1\.xlsx \(R\d_phase1 row \d+ column "
                                         r"generated_report"):
        prepare_review(studies[studies.study_id == long_id], gens[gens.study_id == long_id], 1, seed=2026,
                       strata="dataset", out_dir=tmp_path, formats=("csv", "xlsx"))
    folder = tmp_path / "phase1" / "R1"
    xl = [c.value for row in openpyxl.load_workbook(folder / "R1_phase1.xlsx")["R1_phase1"].iter_rows() for c in row]
    cut = [v for v in xl if isinstance(v, str) and "cell limit" in v]
    assert len(cut) == 1 and len(cut[0]) == XLSX_CELL_LIMIT and cut[0].endswith("has all 41,400 characters]")
    text = (folder / "R1_phase1.csv").read_text("utf-8-sig")
    assert "No acute process. " * 2_299 + "No acute process." in text       # the CSV keeps the whole report
    assert XLSX_CUT_NOTE in (folder / "README.txt").read_text("utf-8")


def test_pysbd_spans_found_by_string_search_give_pysbds_own_sentences():
    """Issue 44: the splitter's segmenter finds each sentence's span by string search instead of one regex per sentence;
    on real reports, repeated ones and white space of every kind it returns what pysbd returns."""
    import pysbd
    plain = pysbd.Segmenter(language="en", clean=False)
    texts = [v["report"] for v in IU.values() if v["report"]]
    texts += [long_text(n=3_000), long_text(sep="\n", n=2_000), "No effusion. " * 40, "A. B. A. B. A. B.",
              "Heart normal.\u00a0\u2003Lungs clear.\u2029Heart normal.\t\tHeart normal.", "...", "ok"]
    for t in texts:
        assert reports._pysbd().segment(t) == plain.segment(t), t[:80]
