"""The restricted-data guard knows a collection by what it is, not by one spelling (seeded random spellings, no
mock)."""
import os
import random
import unicodedata

import pandas as pd
import pytest

from cxr_audit.corpus import PUBLIC_DATASETS_ENV, dataset_access, restricted_dataset, to_studies
from cxr_audit.llm import OpenAIChat, RestrictedDataError, is_restricted, run_batch

BASES = {"mimic-cxr": ["MIMIC-CXR", "mimic", "MIMIC-IV-CXR", "mimic cxr jpg"],
         "chexpert-plus": ["CheXpert Plus", "chexpert", "CheXpert+"],
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
    assert all(restricted_dataset(s) == canonical for s in names), [s for s in names
                                                                    if restricted_dataset(s) != canonical][:5]
    assert all(is_restricted([{"dataset": s, "restricted": False} for s in names]))
    st = to_studies(pd.DataFrame({"study_id": [f"s{i}" for i in range(len(names))], "dataset": names, "findings": "x"}))
    assert st.restricted.all()   # the studies table (and the audit's corpus counts) say so too


def test_public_names_stay_public_and_user_collections_can_be_added():
    rng = random.Random(0)
    names = [s for base in ("iu-xray", "IU X-ray", "openi", "synthetic") for s in spellings(base, rng, 20)]
    assert not any(is_restricted([{"dataset": s} for s in names]))
    assert is_restricted([{"dataset": "Hospital_A-pacs"}], restricted_datasets=["hospital-a"]) == [True]
    assert unicodedata.normalize("NFKC", full_width("MIMIC")) == "MIMIC"


def test_a_named_dataset_not_known_to_be_public_is_held_back_until_declared(monkeypatch):
    rng = random.Random(1)
    names = [s for base in ("Hospital-A PACS", "padchest", "st-elsewhere 2024") for s in spellings(base, rng, 20)]
    monkeypatch.delenv(PUBLIC_DATASETS_ENV, raising=False)
    assert {dataset_access(s) for s in names} == {"unknown"} and all(is_restricted([{"dataset": s} for s in names]))
    # plain prompts: their cell decides
    assert is_restricted([{"dataset": None}, {"dataset": " "}, {}]) == [False, False, False]
    # declared public: by argument, or for the whole session by the environment variable (what --public-dataset sets)
    hospital = [s for s in names if dataset_access(s, public=["hospital-a"]) == "public"]
    assert len(hospital) == 20 and not any(is_restricted([{"dataset": s} for s in hospital],
                                                         public_datasets=["hospital-a"]))
    monkeypatch.setenv(PUBLIC_DATASETS_ENV, "padchest, st-elsewhere")
    assert [dataset_access(s) for s in names].count("public") == 40
    # naming a restricted collection public changes nothing
    assert dataset_access("MIMIC-CXR", public="mimic") == "restricted"


def test_the_remote_guard_refuses_an_unknown_dataset_before_connecting(monkeypatch):
    import socket
    attempts = []

    def no_network(self, address, *args):
        attempts.append(address)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.delenv(PUBLIC_DATASETS_ENV, raising=False)
    llm = OpenAIChat("gpt-x", base_url="http://203.0.113.7/v1", api_key="sk-test")
    reqs = [{"request_id": "h1", "messages": "Hospital text", "dataset": "Hospital-A PACS"}]
    with pytest.raises(RestrictedDataError, match="not known to be public.*public_datasets="):
        run_batch(reqs, llm, cache=False, progress=False)
    assert attempts == []
    out = run_batch(reqs, llm, cache=False, retries=0, progress=False, public_datasets=["hospital-a"]).to_frame()
    assert out.status.tolist() == ["failed"] and attempts  # declared public: the guard let it through (no server there)


def test_cli_llm_commands_hold_back_unknown_datasets_and_take_public_dataset(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    exe = shutil.which("cxr-audit") or str(Path(sys.executable).parent / "cxr-audit")
    pd.DataFrame({"study_id": ["a"], "dataset": ["Hospital-A PACS"], "findings": ["No effusion."],
                  "impression": ["Normal."]}).to_csv(tmp_path / "s.csv", index=False)
    base = [exe, "reref", "--studies", tmp_path / "s.csv", "--out", tmp_path / "o", "--backend", "openai", "--model",
            "m", "--base-url", "http://203.0.113.7/v1", "--variations", "structure:structured", "--timeout", "1",
            "--retries", "0"]
    r = subprocess.run([str(a) for a in base], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OPENAI_API_KEY": "k"})
    assert r.returncode == 2 and "not known to be public" in r.stderr and "--public-dataset" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([str(a) for a in base + ["--public-dataset", "hospital-a"]], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OPENAI_API_KEY": "k"})
    # let through; no server there: the run fails
    assert "not known to be public" not in r.stderr and r.returncode == 1, r.stderr
