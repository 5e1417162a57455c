"""Section parsing, reference extraction, standardization, R2Gen cleaning and sentence splitting
on realistic (invented) chest X-ray reports: MIMIC-like free text with `___` and IU-like fields with `XXXX`.
The section-parsing cases are in fixtures/reports/sections.json.
No real patient data: every report here and there was written for these tests."""
import json
import sys
import types
from pathlib import Path

import pytest

from cxr_audit import reports
from cxr_audit.reports import (clean_report_iu, clean_report_mimic, extract_section, load_section_headers,
                               parse_indication, parse_sections, split_sentences, standardize_report,
                               standardize_reports)

FIXTURE = Path(__file__).parent / "fixtures" / "reports" / "sections.json"


def load_cases() -> list:
    """The section-parsing cases of the fixture (its `_note` says what each field holds), as pytest parameters
    `report, sections, body`: a report given as a list of lines is joined, `body` defaults to ""."""
    cases = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]
    return [pytest.param("\n".join(c["report"]) if isinstance(c["report"], list) else c["report"], c["sections"],
                         c.get("body", ""), id=c["id"]) for c in cases]


CASES = load_cases()
IDS = [c.id for c in CASES]
assert len(CASES) >= 30 and len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("report,sections,body", CASES)
def test_parse_sections(report, sections, body):
    assert parse_sections(report) == sections


@pytest.mark.parametrize("report,sections,body", CASES)
def test_extract_section_rules(report, sections, body):
    # findings, else impression, else the body; impression likewise; "both" counts a stand-in (or a combined block) once
    findings = sections.get("findings") or sections.get("impression") or body
    impression = sections.get("impression") or sections.get("findings") or body
    assert extract_section(report, "findings") == findings
    assert extract_section(report, "impression") == impression
    assert extract_section(report, "both") == (findings if findings == impression else f"{findings} {impression}")


@pytest.mark.parametrize("report,sections,body", CASES)
def test_parse_indication(report, sections, body):
    # the indication, else the default fallback section (history)
    assert parse_indication(report) == (sections.get("indication") or sections.get("history", ""))
    assert parse_indication(report, fallback=()) == sections.get("indication", "")


@pytest.mark.parametrize("report,sections,body", CASES)
def test_full_keeps_every_word(report, sections, body):
    full = extract_section(report, "full")
    assert "  " not in full and full == full.strip()
    if isinstance(report, str): assert full.split() == report.split()


def test_parse_sections_canonical_key_order():
    assert list(parse_sections("IMPRESSION: b\nFINDINGS: a\nINDICATION: c")) == ["indication", "findings", "impression"]


def test_extract_section_unknown_section_lists_choices():
    with pytest.raises(ValueError, match="choose one of 'findings', 'impression', 'both', 'full'"):
        extract_section("FINDINGS: x", "conclusion")


def test_extract_named_sections_have_no_fallback():
    text = "COMPARISON: ___.\nIMPRESSION: The lungs are clear."
    assert extract_section(text, "comparison") == "___."
    assert extract_section(text, "technique") == ""
    assert extract_section(text, "indication") == ""


def test_both_counts_a_combined_block_once_but_keeps_separate_equal_sections():
    assert extract_section("FINDINGS AND IMPRESSION: No acute process.", "both") == "No acute process."
    assert extract_section("FINDINGS: Normal.\nIMPRESSION: Normal.", "both") == "Normal. Normal."


def test_extract_full_from_mapping():
    assert extract_section({"impression": "Normal.", "FINDINGS": "Clear lungs."}, "full") == \
        "FINDINGS: Clear lungs. IMPRESSION: Normal."


def test_headers_override_dict_and_file(tmp_path):
    table = load_section_headers()
    table["impression"] = table["impression"] + ["opinion"]
    assert parse_sections("FINDINGS: Clear. OPINION: Normal.", headers=table) == {"findings": "Clear.",
                                                                                  "impression": "Normal."}
    assert parse_sections("FINDINGS: Clear. OPINION: Normal.") == {"findings": "Clear. OPINION: Normal."}
    path = tmp_path / "headers.json"
    path.write_text('{"_note": "mine", "findings": ["observations?"], "impression": ["summary"]}')
    assert parse_sections("OBSERVATIONS: Clear.\nSUMMARY: Normal.", headers=path) == {"findings": "Clear.",
                                                                                      "impression": "Normal."}
    assert extract_section("FINDINGS: Clear.", "findings", headers=path) == "FINDINGS: Clear."


def test_bad_header_tables(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"): parse_sections("x", headers=bad)
    with pytest.raises(ValueError, match="unknown header key 'summary'"):
        parse_sections("x", headers={"summary": ["s"]})
    with pytest.raises(ValueError, match="must be a list of strings"):
        parse_sections("x", headers={"findings": "findings"})


def test_packaged_table_has_every_variant_the_brief_names():
    cases = {"FINDINGS": "findings", "FINDINGS ": "findings", "FINDING": "findings", "IMPRESSION": "impression",
             "IMPRESSIONS": "impression", "IMPRESSON": "impression", "CONCLUSION": "impression",
             "INDICATION": "indication", "INDICATIONS": "indication", "CLINICAL INDICATION": "indication",
             "REASON FOR EXAMINATION": "indication", "HISTORY": "history", "CLINICAL HISTORY": "history",
             "HX": "history", "COMPARISON": "comparison", "COMPARISONS": "comparison", "TECHNIQUE": "technique",
             "EXAMINATION": "examination", "EXAM": "examination"}
    for header, key in cases.items():
        for form in (header, header.lower(), header.title()):
            assert parse_sections(f"{form}: some text.") == {key: "some text."}, form


# --------------------------------------------------------------------------------------------- standardize_report
def test_standardize_removes_stray_lines_and_fixes_structure():
    raw = ("IMG: mimic/p10/s5012/view1.jpg\r\n<s>\r\n  FINDINGS:   The heart is normal in size.\r\n"
           "\r\n\r\n\r\n [PAD] [PAD]\r\n\tIMPRESSION: No acute process.</s>  \r\n<unk>\r\n\r\n")
    assert standardize_report(raw) == "FINDINGS: The heart is normal in size.\n\nIMPRESSION: No acute process.</s>"


def test_standardize_is_idempotent_and_keeps_content():
    text = "Lungs clear.\n\nHeart   normal.\n"
    once = standardize_report(text)
    assert standardize_report(once) == once == "Lungs clear.\n\nHeart normal."


@pytest.mark.parametrize("deid,expected", [
    ("keep", "Patient is a ___-year-old. XXXX XXXX are intact. Seen [**2101-10-5**]."),
    ("mask", "Patient is a ___-year-old. ___ are intact. Seen ___."),
    ("drop", "Patient is a -year-old. are intact. Seen."),
])
def test_standardize_deid_modes(deid, expected):
    assert standardize_report("Patient is a ___-year-old. XXXX XXXX are intact. Seen [**2101-10-5**].",
                              deid=deid) == expected


def test_standardize_mask_token_and_separator_lines():
    sep = "_" * 78
    assert standardize_report(f"A ___ B\n{sep}\nC", deid="mask", mask_token="<deid>") == f"A <deid> B\n{sep}\nC"
    assert standardize_report("Dr. ___ ___ was paged.", deid="drop") == "Dr. was paged."


def test_standardize_reports_batch_and_errors():
    assert standardize_reports(["a\n\n\nb", None, "IMG: x"]) == ["a\n\nb", "", ""]
    with pytest.raises(ValueError, match="deid must be one of"): standardize_report("x", deid="hide")


# ---------------------------------------------------------------------------------------------- R2Gen cleaning
def test_clean_iu_convention():
    text = "1. The heart is normal in size.. 2. The lungs are clear; no pneumothorax. 3. XXXX XXXX are intact!"
    assert clean_report_iu(text) == ("the heart is normal in size . the lungs are clear no pneumothorax . xxxx xxxx "
                                     "are intact .")


def test_clean_r2gen_compatible_keeps_empty_sentences():
    text = "No acute disease. . Heart size normal."
    assert clean_report_iu(text, r2gen_compatible=True) == "no acute disease .  . heart size normal ."
    assert clean_report_iu(text) == "no acute disease . heart size normal ."
    assert clean_report_mimic(text, r2gen_compatible=True) == "no acute disease .  . heart size normal ."
    assert clean_report_mimic(text) == "no acute disease . heart size normal ."


def test_clean_mimic_newlines_underscores_spaces():
    text = "FINDINGS:\n\n Compared to ___,   the lungs are clear.\n\nIMPRESSION:\n1. No acute process."
    assert clean_report_mimic(text) == "findings compared to the lungs are clear . impression no acute process ."
    assert clean_report_mimic(text, r2gen_compatible=True) == ("findings compared to  the lungs are clear . impression "
                                                               "no acute process .")


def test_clean_iu_compatible_keeps_inner_double_spaces_and_hyphens():
    assert clean_report_iu("Normal chest x-ray.  Lungs  clear.", r2gen_compatible=True) == ("normal chest x-ray . "
                                                                                            "lungs  clear .")
    assert clean_report_iu("Normal chest x-ray.  Lungs  clear.") == "normal chest x-ray . lungs clear ."


def test_clean_empty_inputs():
    assert clean_report_iu(None) == "" and clean_report_mimic("  ") == ""
    assert clean_report_iu("", r2gen_compatible=True) == " ."


# ---------------------------------------------------------------------------------------------- split_sentences
@pytest.mark.parametrize("text,expected", [
    ("IMPRESSION:\n1. Left lower lobe pneumonia.\n2. Small left pleural effusion.",
     ["Left lower lobe pneumonia.", "Small left pleural effusion."]),
    ("1. Nodule measures approx. 1.5 cm. 2. No change vs. prior, e.g. stable granuloma.",
     ["Nodule measures approx. 1.5 cm.", "No change vs. prior, e.g. stable granuloma."]),
    ("FINDINGS: XXXX XXXX are intact. Heart size normal. IMPRESSION: No active disease.",
     ["XXXX XXXX are intact.", "Heart size normal.", "No active disease."]),
    ("Heart size is normal\nLungs are clear\nNo effusion", ["Heart size is normal", "Lungs are clear", "No effusion"]),
    (" PA and lateral views of the chest provided.  There is no focal consolidation,\n effusion, or pneumothorax.",
     ["PA and lateral views of the chest provided.", "There is no focal consolidation, effusion, or pneumothorax."]),
    ("                                 FINAL REPORT\n EXAMINATION:  CHEST (PA AND LAT)\n\n IMPRESSION:  Dr. ___ was "
     "paged at 3:45 p.m. on ___.",
     ["CHEST (PA AND LAT)", "Dr. ___ was paged at 3:45 p.m. on ___."]),
    ("ET tube 4.5 cm above the carina, i.e. appropriately positioned. NG tube in the stomach.",
     ["ET tube 4.5 cm above the carina, i.e. appropriately positioned.", "NG tube in the stomach."]),
    ("the heart is normal . the lungs are clear .", ["the heart is normal .", "the lungs are clear ."]),
    ("", []),
])
def test_split_sentences_tricky(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_callable_gets_segments():
    seen = []
    def splitter(seg): seen.append(seg); return [seg]
    assert split_sentences("FINDINGS: A b.\nIMPRESSION: C d.", splitter=splitter) == ["A b.", "C d."]
    assert seen == ["A b.", "C d."]


def test_split_sentences_unknown_splitter():
    with pytest.raises(ValueError, match="unknown splitter"): split_sentences("x", splitter="spacy")


@pytest.fixture
def fake_stanza(monkeypatch):
    "Install a stand-in `stanza` module; yield a function that sets its Pipeline behaviour."
    mod = types.ModuleType("stanza")
    monkeypatch.setitem(sys.modules, "stanza", mod)
    reports._stanza_pipeline.cache_clear()
    yield mod
    reports._stanza_pipeline.cache_clear()


def test_stanza_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "stanza", None)   # makes `import stanza` raise ImportError
    reports._stanza_pipeline.cache_clear()
    with pytest.raises(ImportError, match=r'split_sentences needs the optional package .stanza.*pip install '
                                          r'"cxr_audit\[stanza\]"'):
        split_sentences("Lungs clear.", splitter="stanza")


def test_stanza_missing_models_explains_offline_install(fake_stanza):
    calls = []
    def Pipeline(*args, **kw):
        calls.append(kw)
        raise FileNotFoundError("Resources file not found at: /nowhere/resources.json")
    fake_stanza.Pipeline = Pipeline
    with pytest.raises(RuntimeError, match="never downloads models") as e:
        split_sentences("Lungs clear.", splitter="stanza")
    assert "stanza.download('en', processors='tokenize'" in str(e.value) and "STANZA_RESOURCES_DIR" in str(e.value)
    assert calls[0]["download_method"] is None            # never asks stanza to download


def test_stanza_splitter_uses_pipeline_sentences(fake_stanza, tmp_path):
    class Sent:
        def __init__(self, text): self.text = text
    def Pipeline(lang, processors, download_method, verbose, **kw):
        assert (lang, processors, download_method, kw) == ("en", "tokenize", None, {"dir": str(tmp_path)})
        return lambda text: types.SimpleNamespace(sentences=[Sent(s + ".") for s in text.split(". ") if s])
    fake_stanza.Pipeline = Pipeline
    out = split_sentences("FINDINGS: Lungs clear. Heart normal", splitter=reports.stanza_splitter(tmp_path))
    assert out == ["Lungs clear.", "Heart normal."]
