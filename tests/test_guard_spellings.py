"""The restricted-data guard knows a collection by what it is, not by one spelling (seeded random spellings, no mock)."""
import random
import unicodedata

import pandas as pd
import pytest

from cxr_audit.corpus import restricted_dataset, to_studies
from cxr_audit.llm import is_restricted

BASES = {"mimic-cxr": ["MIMIC-CXR", "mimic", "MIMIC-IV-CXR", "mimic cxr jpg"], "chexpert-plus": ["CheXpert Plus", "chexpert", "CheXpert+"],
         "rexgradient": ["ReXGradient", "ReXGradient-160K"]}
SUFFIXES = ["", "-jpg", "-v2", "-2.0.0", " v1", "_160k", " (2024)"]


def full_width(s: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in s)


def spellings(base: str, rng: random.Random, n: int = 60):
    for _ in range(n):
        s = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in base)
        s = "".join(c + (rng.choice("-_ ./") if rng.random() < 0.2 else "") for c in s)
        s = s + rng.choice(SUFFIXES)
        yield full_width(s) if rng.random() < 0.2 else s


@pytest.mark.parametrize("canonical", sorted(BASES))
def test_any_spelling_of_a_restricted_collection_is_restricted(canonical):
    rng = random.Random(canonical)
    names = [s for base in BASES[canonical] for s in spellings(base, rng)]
    assert all(restricted_dataset(s) == canonical for s in names), [s for s in names if restricted_dataset(s) != canonical][:5]
    assert all(is_restricted([{"dataset": s, "restricted": False} for s in names]))
    st = to_studies(pd.DataFrame({"study_id": [f"s{i}" for i in range(len(names))], "dataset": names, "findings": "x"}))
    assert st.restricted.all()   # the studies table (and the audit's corpus counts) say so too


def test_public_names_stay_public_and_user_collections_can_be_added():
    rng = random.Random(0)
    names = [s for base in ("iu-xray", "IU X-ray", "openi", "padchest-public", "synthetic") for s in spellings(base, rng, 20)]
    assert not any(is_restricted([{"dataset": s} for s in names]))
    assert is_restricted([{"dataset": "Hospital_A-pacs"}], restricted_datasets=["hospital-a"]) == [True]
    assert unicodedata.normalize("NFKC", full_width("MIMIC")) == "MIMIC"
