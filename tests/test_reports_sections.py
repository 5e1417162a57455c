"""Section parsing, reference extraction, standardization, R2Gen cleaning and sentence splitting
on realistic (invented) chest X-ray reports: MIMIC-like free text with `___` and IU-like fields with `XXXX`.
No real patient data: every report below was written for these tests."""
import sys
import types

import pytest

from cxr_audit import reports
from cxr_audit.reports import (clean_report_iu, clean_report_mimic, extract_section, load_section_headers,
                               parse_indication, parse_sections, split_sentences, standardize_report,
                               standardize_reports)

# ---------------------------------------------------------------------------------------------------------------
# Each case: id, report (text or IU-style mapping), expected parse_sections, then the expected
# extract_section(..., "findings"), (..., "impression"), (..., "both") and parse_indication(...).
# ---------------------------------------------------------------------------------------------------------------
CASES = [
    ("mimic_modern_full",
     """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 INDICATION:  ___ year old woman with productive cough  // eval for pneumonia

 TECHNIQUE:  Chest PA and lateral

 COMPARISON:  ___

 FINDINGS:

 The lungs are clear without focal consolidation.  No pleural effusion or
 pneumothorax is seen.  Heart size is normal.

 IMPRESSION:

 No acute cardiopulmonary process.
""",
     {"examination": "CHEST (PA AND LAT)",
      "indication": "___ year old woman with productive cough // eval for pneumonia",
      "technique": "Chest PA and lateral", "comparison": "___",
      "findings": "The lungs are clear without focal consolidation. No pleural effusion or pneumothorax is seen. Heart size is normal.",
      "impression": "No acute cardiopulmonary process."},
     "The lungs are clear without focal consolidation. No pleural effusion or pneumothorax is seen. Heart size is normal.",
     "No acute cardiopulmonary process.",
     "The lungs are clear without focal consolidation. No pleural effusion or pneumothorax is seen. Heart size is normal. No acute cardiopulmonary process.",
     "___ year old woman with productive cough // eval for pneumonia"),

    ("mimic_wet_read_dropped",
     """WET READ: ___ ___ ___ 9:12 PM
  Right lower lobe opacity concerning for pneumonia.
 ______________________________________________________________________________
                                 FINAL REPORT
 INDICATION:  ___M with fever.

 FINDINGS:  Patchy right lower lobe opacity.  No effusion.

 IMPRESSION:  Right lower lobe pneumonia.
""",
     {"indication": "___M with fever.", "findings": "Patchy right lower lobe opacity. No effusion.",
      "impression": "Right lower lobe pneumonia."},
     "Patchy right lower lobe opacity. No effusion.", "Right lower lobe pneumonia.",
     "Patchy right lower lobe opacity. No effusion. Right lower lobe pneumonia.", "___M with fever."),

    ("mimic_exam_title_line_and_history",
     """                                 FINAL REPORT
 PA AND LATERAL CHEST, ___

 HISTORY:  ___-year-old female with cough.

 FINDINGS:  The heart size is normal.  The lungs are clear.

 IMPRESSION:  No pneumonia.
""",
     {"examination": "PA AND LATERAL CHEST, ___", "history": "___-year-old female with cough.",
      "findings": "The heart size is normal. The lungs are clear.", "impression": "No pneumonia."},
     "The heart size is normal. The lungs are clear.", "No pneumonia.",
     "The heart size is normal. The lungs are clear. No pneumonia.", "___-year-old female with cough."),

    ("mimic_title_with_colon_impression_only",
     """PA AND LATERAL CHEST:

CLINICAL INDICATION:  Chest pain.

IMPRESSION:  PA and lateral chest compared to ___:

Normal heart size.  Lungs clear.
""",
     {"examination": "PA AND LATERAL CHEST", "indication": "Chest pain.",
      "impression": "PA and lateral chest compared to ___: Normal heart size. Lungs clear."},
     "PA and lateral chest compared to ___: Normal heart size. Lungs clear.",
     "PA and lateral chest compared to ___: Normal heart size. Lungs clear.",
     "PA and lateral chest compared to ___: Normal heart size. Lungs clear.", "Chest pain."),

    ("mimic_findings_and_impression_combined",
     """EXAMINATION:  CHEST PORTABLE

REASON FOR EXAMINATION:  Line placement.

FINDINGS AND IMPRESSION:
Right PICC tip in the mid SVC.  No pneumothorax.
""",
     {"examination": "CHEST PORTABLE", "indication": "Line placement.",
      "findings": "Right PICC tip in the mid SVC. No pneumothorax.",
      "impression": "Right PICC tip in the mid SVC. No pneumothorax."},
     "Right PICC tip in the mid SVC. No pneumothorax.", "Right PICC tip in the mid SVC. No pneumothorax.",
     "Right PICC tip in the mid SVC. No pneumothorax.", "Line placement."),

    ("findings_slash_impression",
     "FINDINGS/IMPRESSION:  Stable cardiomegaly.  No pulmonary edema.",
     {"findings": "Stable cardiomegaly. No pulmonary edema.", "impression": "Stable cardiomegaly. No pulmonary edema."},
     "Stable cardiomegaly. No pulmonary edema.", "Stable cardiomegaly. No pulmonary edema.",
     "Stable cardiomegaly. No pulmonary edema.", ""),

    ("findings_ampersand_impression",
     "INDICATION: Fever.\nFindings & Impression: Left lower lobe consolidation.",
     {"indication": "Fever.", "findings": "Left lower lobe consolidation.", "impression": "Left lower lobe consolidation."},
     "Left lower lobe consolidation.", "Left lower lobe consolidation.", "Left lower lobe consolidation.", "Fever."),

    ("impression_only_findings_falls_back",
     "                                 FINAL REPORT\n INDICATION:  Hypoxia.\n\n COMPARISON:  ___.\n\n IMPRESSION:  Mild pulmonary edema.\n",
     {"indication": "Hypoxia.", "comparison": "___.", "impression": "Mild pulmonary edema."},
     "Mild pulmonary edema.", "Mild pulmonary edema.", "Mild pulmonary edema.", "Hypoxia."),

    ("findings_only_impression_falls_back",
     "FINDINGS:  Low lung volumes.  Bibasilar atelectasis.",
     {"findings": "Low lung volumes. Bibasilar atelectasis."},
     "Low lung volumes. Bibasilar atelectasis.", "Low lung volumes. Bibasilar atelectasis.",
     "Low lung volumes. Bibasilar atelectasis.", ""),

    ("conclusion_is_impression",
     "TECHNIQUE: Single frontal view.\nFINDINGS: Endotracheal tube 4 cm above the carina.\nCONCLUSION: Satisfactory tube position.",
     {"technique": "Single frontal view.", "findings": "Endotracheal tube 4 cm above the carina.",
      "impression": "Satisfactory tube position."},
     "Endotracheal tube 4 cm above the carina.", "Satisfactory tube position.",
     "Endotracheal tube 4 cm above the carina. Satisfactory tube position.", ""),

    ("impression_and_conclusion_joined",
     "IMPRESSION: No pneumothorax.\nCONCLUSION: Lines are stable.",
     {"impression": "No pneumothorax. Lines are stable."},
     "No pneumothorax. Lines are stable.", "No pneumothorax. Lines are stable.",
     "No pneumothorax. Lines are stable.", ""),

    ("typo_space_before_colon_and_plural_impressions",
     "FINDINGS : Heart size normal.  Lungs clear.\nIMPRESSIONS: Normal study.",
     {"findings": "Heart size normal. Lungs clear.", "impression": "Normal study."},
     "Heart size normal. Lungs clear.", "Normal study.", "Heart size normal. Lungs clear. Normal study.", ""),

    ("typo_finding_impresson",
     "FINDING:  Small left pleural effusion.\nIMPRESSON:  Small left effusion.",
     {"findings": "Small left pleural effusion.", "impression": "Small left effusion."},
     "Small left pleural effusion.", "Small left effusion.", "Small left pleural effusion. Small left effusion.", ""),

    ("indications_plural_and_hx",
     "INDICATIONS: Shortness of breath.\nHX: CHF.\nFINDINGS: Cardiomegaly with mild interstitial edema.",
     {"indication": "Shortness of breath.", "history": "CHF.", "findings": "Cardiomegaly with mild interstitial edema."},
     "Cardiomegaly with mild interstitial edema.", "Cardiomegaly with mild interstitial edema.",
     "Cardiomegaly with mild interstitial edema.", "Shortness of breath."),

    ("lowercase_headers",
     "indication: fever\nfindings: no focal consolidation\nimpression: no pneumonia",
     {"indication": "fever", "findings": "no focal consolidation", "impression": "no pneumonia"},
     "no focal consolidation", "no pneumonia", "no focal consolidation no pneumonia", "fever"),

    ("inline_title_case",
     "Findings: The heart is normal in size. The lungs are clear. Impression: Normal chest.",
     {"findings": "The heart is normal in size. The lungs are clear.", "impression": "Normal chest."},
     "The heart is normal in size. The lungs are clear.", "Normal chest.",
     "The heart is normal in size. The lungs are clear. Normal chest.", ""),

    ("iu_text_inline_all_sections",
     "Comparison: None. Indication: Chest pain. Findings: The cardiomediastinal silhouette is within normal limits. "
     "XXXX XXXX are intact. Impression: No acute cardiopulmonary abnormality.",
     {"indication": "Chest pain.", "comparison": "None.",
      "findings": "The cardiomediastinal silhouette is within normal limits. XXXX XXXX are intact.",
      "impression": "No acute cardiopulmonary abnormality."},
     "The cardiomediastinal silhouette is within normal limits. XXXX XXXX are intact.",
     "No acute cardiopulmonary abnormality.",
     "The cardiomediastinal silhouette is within normal limits. XXXX XXXX are intact. No acute cardiopulmonary abnormality.",
     "Chest pain."),

    ("iu_mapping_uppercase_keys",
     {"COMPARISON": "XXXX, XXXX", "INDICATION": "XXXX-year-old female with XXXX.",
      "FINDINGS": "Heart size normal. No focal airspace disease.", "IMPRESSION": "No active disease."},
     {"indication": "XXXX-year-old female with XXXX.", "comparison": "XXXX, XXXX",
      "findings": "Heart size normal. No focal airspace disease.", "impression": "No active disease."},
     "Heart size normal. No focal airspace disease.", "No active disease.",
     "Heart size normal. No focal airspace disease. No active disease.", "XXXX-year-old female with XXXX."),

    ("iu_mapping_lowercase_missing_findings",
     {"findings": None, "impression": "1. No acute disease. 2. Stable calcified granuloma.", "indication": ""},
     {"impression": "1. No acute disease. 2. Stable calcified granuloma."},
     "1. No acute disease. 2. Stable calcified granuloma.", "1. No acute disease. 2. Stable calcified granuloma.",
     "1. No acute disease. 2. Stable calcified granuloma.", ""),

    ("iu_mapping_unknown_keys_ignored",
     {"Findings": "Normal heart and lungs.", "MeSH": "normal", "image": "CXR1_1_IM-0001-3001.png",
      "Indication": float("nan")},
     {"findings": "Normal heart and lungs."},
     "Normal heart and lungs.", "Normal heart and lungs.", "Normal heart and lungs.", ""),

    ("no_header_body_fallback",
     "The lungs are clear.  No pleural effusion or pneumothorax.\nHeart size is normal.",
     {},
     "The lungs are clear. No pleural effusion or pneumothorax. Heart size is normal.",
     "The lungs are clear. No pleural effusion or pneumothorax. Heart size is normal.",
     "The lungs are clear. No pleural effusion or pneumothorax. Heart size is normal.", ""),

    ("banner_only_body_fallback",
     "                                 FINAL REPORT\n  Portable chest.  Lines and tubes unchanged.\n",
     {},
     "Portable chest. Lines and tubes unchanged.", "Portable chest. Lines and tubes unchanged.",
     "Portable chest. Lines and tubes unchanged.", ""),

    ("iu_text_no_header_with_xxxx",
     "Heart size normal. XXXX XXXX are intact. Lungs clear.",
     {},
     "Heart size normal. XXXX XXXX are intact. Lungs clear.", "Heart size normal. XXXX XXXX are intact. Lungs clear.",
     "Heart size normal. XXXX XXXX are intact. Lungs clear.", ""),

    ("indication_only_gives_empty_reference",
     "INDICATION: Rule out pneumonia.",
     {"indication": "Rule out pneumonia."},
     "", "", "", "Rule out pneumonia."),

    ("indication_then_unlabelled_narrative",
     "INDICATION: Cough.\n\nFINAL REPORT\nThe lungs are clear.",
     {"indication": "Cough."},
     "The lungs are clear.", "The lungs are clear.", "The lungs are clear.", "Cough."),

    ("clinical_history_and_comparisons",
     "CLINICAL HISTORY: Trauma.\nCOMPARISONS: ___ and ___.\nFINDINGS: No displaced rib fracture.\nIMPRESSION: No acute findings.",
     {"history": "Trauma.", "comparison": "___ and ___.", "findings": "No displaced rib fracture.",
      "impression": "No acute findings."},
     "No displaced rib fracture.", "No acute findings.", "No displaced rib fracture. No acute findings.", "Trauma."),

    ("exam_header_short",
     "EXAM: CHEST 1 VIEW\nINDICATION: Weakness\nIMPRESSION: No acute process.",
     {"examination": "CHEST 1 VIEW", "indication": "Weakness", "impression": "No acute process."},
     "No acute process.", "No acute process.", "No acute process.", "Weakness"),

    ("headers_alone_on_their_lines",
     "EXAMINATION\nChest radiograph.\n\nFINDINGS\nMild cardiomegaly.\n\nIMPRESSION\nCardiomegaly without edema.",
     {"examination": "Chest radiograph.", "findings": "Mild cardiomegaly.", "impression": "Cardiomegaly without edema."},
     "Mild cardiomegaly.", "Cardiomegaly without edema.", "Mild cardiomegaly. Cardiomegaly without edema.", ""),

    ("numbered_impression",
     "FINDINGS:  Left lower lobe opacity with small effusion.\n\nIMPRESSION:\n1.  Left lower lobe pneumonia.\n2.  Small left pleural effusion.",
     {"findings": "Left lower lobe opacity with small effusion.",
      "impression": "1. Left lower lobe pneumonia. 2. Small left pleural effusion."},
     "Left lower lobe opacity with small effusion.", "1. Left lower lobe pneumonia. 2. Small left pleural effusion.",
     "Left lower lobe opacity with small effusion. 1. Left lower lobe pneumonia. 2. Small left pleural effusion.", ""),

    ("history_inside_indication_not_a_header",
     "INDICATION:  History: ___M with chest pain\n\nFINDINGS:  Normal cardiomediastinal contours.\n",
     {"indication": "History: ___M with chest pain", "findings": "Normal cardiomediastinal contours."},
     "Normal cardiomediastinal contours.", "Normal cardiomediastinal contours.", "Normal cardiomediastinal contours.",
     "History: ___M with chest pain"),

    ("flattened_mimic_one_line",
     "WET READ: ___ ___ 7:43 PM Left lower lobe opacity. _____________________________________________ "
     "FINAL REPORT EXAMINATION: CHEST (PA AND LAT) INDICATION: ___F with SOB COMPARISON: ___ "
     "FINDINGS: The lungs are clear. IMPRESSION: No acute process.",
     {"examination": "CHEST (PA AND LAT)", "indication": "___F with SOB", "comparison": "___",
      "findings": "The lungs are clear.", "impression": "No acute process."},
     "The lungs are clear.", "No acute process.", "The lungs are clear. No acute process.", "___F with SOB"),

    ("wet_read_version_pfi_and_title",
     """WET READ VERSION #1 ___ ___ 3:51 AM
  No pneumothorax.
______________________________________________________________________________
                                 FINAL REPORT
 PORTABLE AP CHEST ___ AT 04:50 A.M.

 PROVISIONAL FINDINGS IMPRESSION (PFI): ETT in good position.

 FINDINGS:  Endotracheal tube terminates 5 cm above the carina.

 IMPRESSION:  Appropriate endotracheal tube position.
""",
     {"examination": "PORTABLE AP CHEST ___ AT 04:50 A.M.",
      "findings": "Endotracheal tube terminates 5 cm above the carina.",
      "impression": "Appropriate endotracheal tube position."},
     "Endotracheal tube terminates 5 cm above the carina.", "Appropriate endotracheal tube position.",
     "Endotracheal tube terminates 5 cm above the carina. Appropriate endotracheal tube position.", ""),

    ("notification_and_recommendation_dropped",
     "IMPRESSION:  Right upper lobe nodule.\n\nRECOMMENDATION(S):  Chest CT in 3 months.\n\n"
     "NOTIFICATION:  Dr. ___ was informed by telephone at 2:15 pm on ___.",
     {"impression": "Right upper lobe nodule."},
     "Right upper lobe nodule.", "Right upper lobe nodule.", "Right upper lobe nodule.", ""),

    ("reason_for_exam_and_technique",
     "REASON FOR EXAM: Fall.\nTECHNIQUE: AP and lateral views.\nFINDINGS: No acute fracture.",
     {"indication": "Fall.", "technique": "AP and lateral views.", "findings": "No acute fracture."},
     "No acute fracture.", "No acute fracture.", "No acute fracture.", "Fall."),

    ("crlf_and_tabs",
     "INDICATION:\tDyspnea.\r\nFINDINGS:\tBilateral\r\n\tinterstitial opacities.\r\nIMPRESSION:\tPulmonary edema.\r\n",
     {"indication": "Dyspnea.", "findings": "Bilateral interstitial opacities.", "impression": "Pulmonary edema."},
     "Bilateral interstitial opacities.", "Pulmonary edema.", "Bilateral interstitial opacities. Pulmonary edema.",
     "Dyspnea."),

    ("empty_findings_header_counts_as_absent",
     "FINDINGS:\n\nIMPRESSION:  Low lung volumes.",
     {"impression": "Low lung volumes."},
     "Low lung volumes.", "Low lung volumes.", "Low lung volumes.", ""),

    ("title_case_technique_comparison",
     "Technique: Frontal and lateral views of the chest.\nComparison: Chest radiograph from ___.\n"
     "Findings: Stable mild cardiomegaly.\nImpression: No acute change.",
     {"technique": "Frontal and lateral views of the chest.", "comparison": "Chest radiograph from ___.",
      "findings": "Stable mild cardiomegaly.", "impression": "No acute change."},
     "Stable mild cardiomegaly.", "No acute change.", "Stable mild cardiomegaly. No acute change.", ""),

    ("lowercase_colon_words_mid_sentence_are_not_headers",
     "FINDINGS: Lungs are clear, unchanged since the prior exam: no effusion. Impression of cardiomegaly is not confirmed.",
     {"findings": "Lungs are clear, unchanged since the prior exam: no effusion. Impression of cardiomegaly is not confirmed."},
     "Lungs are clear, unchanged since the prior exam: no effusion. Impression of cardiomegaly is not confirmed.",
     "Lungs are clear, unchanged since the prior exam: no effusion. Impression of cardiomegaly is not confirmed.",
     "Lungs are clear, unchanged since the prior exam: no effusion. Impression of cardiomegaly is not confirmed.", ""),

    ("addendum_stays_with_impression",
     "FINDINGS: Right basilar opacity.\nIMPRESSION: Possible aspiration.\n\nADDENDUM: Findings discussed with the team.",
     {"findings": "Right basilar opacity.",
      "impression": "Possible aspiration. ADDENDUM: Findings discussed with the team."},
     "Right basilar opacity.", "Possible aspiration. ADDENDUM: Findings discussed with the team.",
     "Right basilar opacity. Possible aspiration. ADDENDUM: Findings discussed with the team.", ""),

    ("clinical_information_and_prior_study",
     "CLINICAL INFORMATION: Post-operative check.\nPRIOR STUDY: ___.\nFINDINGS: Sternotomy wires intact. Small bilateral effusions.",
     {"indication": "Post-operative check.", "comparison": "___.",
      "findings": "Sternotomy wires intact. Small bilateral effusions."},
     "Sternotomy wires intact. Small bilateral effusions.", "Sternotomy wires intact. Small bilateral effusions.",
     "Sternotomy wires intact. Small bilateral effusions.", "Post-operative check."),
]

IDS = [c[0] for c in CASES]
assert len(CASES) >= 30 and len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_parse_sections(case):
    _, report, sections, *_ = case
    assert parse_sections(report) == sections


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_extract_section_rules(case):
    _, report, _, findings, impression, both, _ = case
    assert extract_section(report, "findings") == findings
    assert extract_section(report, "impression") == impression
    assert extract_section(report, "both") == both


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_parse_indication(case):
    _, report, sections, *_, indication = case
    assert parse_indication(report) == indication
    assert parse_indication(report, fallback=()) == sections.get("indication", "")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_full_keeps_every_word(case):
    _, report, *_ = case
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
    assert parse_sections("FINDINGS: Clear. OPINION: Normal.", headers=table) == {"findings": "Clear.", "impression": "Normal."}
    assert parse_sections("FINDINGS: Clear. OPINION: Normal.") == {"findings": "Clear. OPINION: Normal."}
    path = tmp_path / "headers.json"
    path.write_text('{"_note": "mine", "findings": ["observations?"], "impression": ["summary"]}')
    assert parse_sections("OBSERVATIONS: Clear.\nSUMMARY: Normal.", headers=path) == {"findings": "Clear.", "impression": "Normal."}
    assert extract_section("FINDINGS: Clear.", "findings", headers=path) == "FINDINGS: Clear."


def test_bad_header_tables(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"): parse_sections("x", headers=bad)
    with pytest.raises(ValueError, match="unknown header key 'summary'"): parse_sections("x", headers={"summary": ["s"]})
    with pytest.raises(ValueError, match="must be a list of strings"): parse_sections("x", headers={"findings": "findings"})


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
    assert standardize_report("Patient is a ___-year-old. XXXX XXXX are intact. Seen [**2101-10-5**].", deid=deid) == expected


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
    assert clean_report_iu(text) == "the heart is normal in size . the lungs are clear no pneumothorax . xxxx xxxx are intact ."


def test_clean_r2gen_compatible_keeps_empty_sentences():
    text = "No acute disease. . Heart size normal."
    assert clean_report_iu(text, r2gen_compatible=True) == "no acute disease .  . heart size normal ."
    assert clean_report_iu(text) == "no acute disease . heart size normal ."
    assert clean_report_mimic(text, r2gen_compatible=True) == "no acute disease .  . heart size normal ."
    assert clean_report_mimic(text) == "no acute disease . heart size normal ."


def test_clean_mimic_newlines_underscores_spaces():
    text = "FINDINGS:\n\n Compared to ___,   the lungs are clear.\n\nIMPRESSION:\n1. No acute process."
    assert clean_report_mimic(text) == "findings compared to the lungs are clear . impression no acute process ."
    assert clean_report_mimic(text, r2gen_compatible=True) == "findings compared to  the lungs are clear . impression no acute process ."


def test_clean_iu_compatible_keeps_inner_double_spaces_and_hyphens():
    assert clean_report_iu("Normal chest x-ray.  Lungs  clear.", r2gen_compatible=True) == "normal chest x-ray . lungs  clear ."
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
    ("                                 FINAL REPORT\n EXAMINATION:  CHEST (PA AND LAT)\n\n IMPRESSION:  Dr. ___ was paged at 3:45 p.m. on ___.",
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
    with pytest.raises(ImportError, match=r'split_sentences needs the optional package .stanza.*pip install "cxr_audit\[stanza\]"'):
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
