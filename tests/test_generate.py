"""cxr_audit.generate with tiny randomly initialised models built from configs (nothing is downloaded).

Covers: every preset deterministic across runs, per-sample seeding independent of batching and order, `truncated`
exactly when the token cap was hit, the anti-template processors on crafted logits and on a tiny GPT-2, loading a
model saved to a local folder, DICOM loading (when pydicom is installed), resuming from a
checkpoint, the simulated systems' policy response, and importing the module without torch.
"""
import dataclasses
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from cxr_audit.cohort import FRONTAL_VIEWS, Cohort, recipe_004_iu, recipe_004_mimic, write_cohort  # noqa: E402
from cxr_audit.core import InputError, sha256_frame  # noqa: E402
from cxr_audit.corpus import load_iu_xray  # noqa: E402
from cxr_audit.generate import (  # noqa: E402
                                POLICIES, DecodingPolicy, EarlyEOSSuppression, EOSReweight, HFReportGenerator,
                                RecurrencePenalty, SimulatedGenerator, TemplatePhrasePenalty,
                                generate_table, generation_inputs, load_image, policy_summary, sample_seed,
                                tiny_model)
from cxr_audit.synth import make_demo_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IU_REAL = ROOT / "tests/fixtures/iu_real/iu_valid_rexrank_sample.json"   # 50 real IU X-ray studies (ReXrank JSON)


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread (conftest)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return d


@pytest.fixture(scope="module")
def studies(images):
    inds = ["Cough.", "", "Chest pain and shortness of breath.", None, "Fever.", "Line placement."]
    return pd.DataFrame({"study_id": [f"s{i}" for i in range(6)],
                         "image_paths": [[str(images / f"{i}.png")] for i in range(6)], "indication": inds})


@pytest.fixture(scope="module")
def ved():
    return tiny_model("encoder-decoder").generator(batch_size=4)


@pytest.fixture(scope="module")
def chat():
    return tiny_model("chat").generator(batch_size=4)


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("text").generator(prompt="the lungs", batch_size=4)


def short(name, n=24):
    return dataclasses.replace(POLICIES[name], max_new_tokens=n)


# --- determinism ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(POLICIES))
def test_each_preset_gives_identical_outputs_in_two_runs(ved, studies, name):
    a = generate_table(ved, studies, name, seeds=[0, 1], progress=False)
    b = generate_table(ved, studies, name, seeds=[0, 1], progress=False)
    assert a.error.isna().all()
    assert sha256_frame(a) == sha256_frame(b)
    p = POLICIES[name]
    assert sorted(a.seed.unique()) == ([0, 1] if p.do_sample else [0])
    if p.do_sample:  # another seed gives other reports
        h = a.pivot(index="study_id", columns="seed", values="hypothesis")
        assert (h[0] != h[1]).any()


def test_presets_on_the_chat_and_text_models(chat, gpt2, studies):
    for gen in (chat, gpt2):
        pols = [short(n) for n in POLICIES]
        a = generate_table(gen, studies, pols, seeds=[3], use_indication=True, progress=False)
        b = generate_table(gen, studies, pols, seeds=[3], use_indication=True, progress=False)
        assert a.error.isna().all() and sha256_frame(a) == sha256_frame(b)


# --- per-sample seeding -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ved", "chat", "gpt2"])
def test_sampling_does_not_depend_on_batch_size_or_order(request, studies, kind):
    gen = request.getfixturevalue(kind)
    pols = [short("K50"), short("LMIMIC_SAMPLING")]
    by = lambda t: t.set_index("sample_id").hypothesis.sort_index()
    ref = by(generate_table(gen, studies, pols, seeds=[0, 5], use_indication=True, batch_size=1, progress=False))
    for bs, order in ((3, slice(None)), (6, slice(None, None, -1)), (4, [2, 0, 5, 1, 4, 3])):
        st = studies.iloc[order]
        t = generate_table(gen, st, pols, seeds=[0, 5], use_indication=True, batch_size=bs, progress=False)
        pd.testing.assert_series_equal(by(t), ref)
    # a subset run (different batch composition) gives the same reports for the samples it shares
    sub = by(generate_table(gen, studies.iloc[[1, 4]], pols, seeds=[5], use_indication=True, batch_size=2,
                            progress=False))
    pd.testing.assert_series_equal(sub, ref[sub.index])


def test_direct_calls_are_seeded_by_image_path(ved, images):
    paths = [str(images / f"{i}.png") for i in range(4)]
    g = HFReportGenerator(ved.model, ved.processor, policy=short("K50"), batch_size=4, seed=9)
    assert g(paths) == g(paths[:2]) + g(paths[2:])
    assert g(paths) != HFReportGenerator(ved.model, ved.processor, policy=short("K50"), seed=10)(paths)


# --- truncation -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", ["B4", "G1", "K50", "R2GEN"])
def test_truncated_exactly_when_the_cap_is_reached(ved, studies, base):
    # an end-token weight makes the tiny model finish some reports within the cap, not all
    p = dataclasses.replace(POLICIES[base], name=f"{base}-stop", max_new_tokens=12, processors=(EOSReweight(30),))
    t = generate_table(ved, studies, p, seeds=[0], progress=False)
    assert (t.truncated == (t.n_tokens == 12)).all()
    assert (t.n_tokens <= 12).all()
    # cross-check against the raw token ids of model.generate (deterministic policies)
    if not p.do_sample:
        pv = ved.image_processor([load_image(s[0]) for s in studies.image_paths], return_tensors="pt")["pixel_values"]
        seq = ved.model.generate(pixel_values=pv, **p.to_generate_kwargs(ved.tokenizer, prompt_length=1),
                                 pad_token_id=0, eos_token_id=3)
        no_eos = [3 not in row[1:] for row in seq.tolist()]
        assert t.truncated.tolist() == no_eos


def test_a_mix_of_truncated_and_finished_outputs(ved, studies):
    p = DecodingPolicy("B4-stop", num_beams=4, max_new_tokens=12, processors=[EOSReweight(30)])
    t = generate_table(ved, studies, p, progress=False)
    assert 0 < t.truncated.sum() < len(t)


# --- processors -------------------------------------------------------------------------------------------------

def test_processors_on_crafted_torch_logits():
    ids = torch.tensor([[9, 1, 2], [9, 4, 4], [9, 0, 5]])          # prompt token 9, then two generated tokens
    s = torch.zeros(3, 8)
    t = TemplatePhrasePenalty(phrases=[(1, 2, 3), (4, 5)], penalty=2.0, prompt_length=1)(ids, s)
    assert t[0, 3] == -2 and t[2].tolist() == [0] * 8 and t[1, 5] == -2 and (t != 0).sum() == 2
    r = RecurrencePenalty(lag1=3.0, lag2=1.0, prompt_length=1)(ids, s)
    assert r[0, 2] == -3 and r[0, 1] == -1 and r[1, 4] == -4 and (r < 0).sum() == 5
    e = EarlyEOSSuppression(min_tokens=3, eos_token_id=7, prompt_length=1)(ids, s)
    assert torch.isinf(e[:, 7]).all() and (e[:, :7] == 0).all()
    assert (EarlyEOSSuppression(min_tokens=2, eos_token_id=7, prompt_length=1)(ids, s) == 0).all()
    w = EOSReweight(0.1, eos_token_id=7)(ids, s)
    assert torch.allclose(w[:, 7], torch.full((3,), math.log(0.1))) and (w[:, :7] == 0).all()
    assert (s == 0).all()                                           # the input scores are not modified
    # probabilities move in the expected direction after softmax
    logits = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    p0 = logits.softmax(-1)
    assert EOSReweight(5.0, eos_token_id=7)(ids[:1], logits).softmax(-1)[0, 7] > p0[0, 7]
    assert EOSReweight(0.2, eos_token_id=7)(ids[:1], logits).softmax(-1)[0, 7] < p0[0, 7]
    assert TemplatePhrasePenalty(phrases=[(1, 2, 3)], prompt_length=1)(ids[:1], logits).softmax(-1)[0, 3] < p0[0, 3]


def _raw(gen, policy, n=4):
    "Generated token ids of the tiny GPT-2 (prompt removed) under a policy."
    prompts = ["the lungs", "heart size is", "no acute", "there is"][:n]
    seqs = [gen.tokenizer(p)["input_ids"] for p in prompts]
    L = max(map(len, seqs))
    ids = torch.tensor([[0] * (L - len(s)) + s for s in seqs])
    mask = (torch.arange(L) >= torch.tensor([L - len(s) for s in seqs])[:, None]).long()
    out = gen.model.generate(input_ids=ids, attention_mask=mask,
                             **policy.to_generate_kwargs(gen.tokenizer, prompt_length=L), pad_token_id=0,
                             eos_token_id=3)
    return [row[L:] for row in out.tolist()]


def _until_eos(row):
    return row[:row.index(3)] if 3 in row else row


def test_processors_move_a_tiny_gpt2_in_the_expected_direction(gpt2):
    never_stop = EOSReweight(1e-9)
    base = _raw(gpt2, DecodingPolicy("g", max_new_tokens=20, processors=[never_stop]))
    # recurrence: immediate repeats vanish under an infinite lag-1 penalty, lag-2 repeats under lag2=inf
    rep1 = lambda rows: sum(a == b for r in rows for a, b in zip(r, r[1:]))
    rep2 = lambda rows: sum(a == c for r in rows for a, c in zip(r, r[2:]))
    assert rep1(base) > 0
    assert rep1(_raw(gpt2, DecodingPolicy("g", max_new_tokens=20,
                                          processors=[never_stop, RecurrencePenalty(lag1=math.inf, lag2=0)]))) == 0
    assert rep2(_raw(gpt2, DecodingPolicy("g", max_new_tokens=20,
                                          processors=[never_stop, RecurrencePenalty(lag1=0, lag2=math.inf)]))) == 0
    # template phrase: a bigram the model writes disappears when its continuation is banned
    bigram = tuple(base[0][:2])
    bigrams = lambda rows: sum(tuple(r[i:i + 2]) == bigram for r in rows for i in range(len(r) - 1))
    assert bigrams(base) > 0
    pen = _raw(gpt2, DecodingPolicy("g", max_new_tokens=20,
                                    processors=[never_stop, TemplatePhrasePenalty(phrases=[bigram], penalty=math.inf)]))
    assert bigrams(pen) == 0
    # end token: forced early stop, held off by early-EOS suppression; a weight > 1 shortens, < 1 lengthens
    lens = lambda procs: [len(_until_eos(r)) for r in _raw(gpt2,
                                                           DecodingPolicy("g", max_new_tokens=20, processors=procs))]
    assert lens([EOSReweight(1e9)]) == [0] * 4
    assert lens([EOSReweight(1e9), EarlyEOSSuppression(min_tokens=6)]) == [6] * 4
    assert sum(lens([EOSReweight(1e3)])) < sum(lens([EOSReweight(1.0)])) <= sum(lens([EOSReweight(1e-3)]))


def test_text_phrases_bind_to_the_tokenizer(gpt2):
    b = TemplatePhrasePenalty().bind(gpt2.tokenizer, prompt_length=3)
    ids = gpt2.tokenizer("no acute cardiopulmonary process", add_special_tokens=False)["input_ids"]
    assert tuple(ids) in b.phrases and b.prompt_length == 3
    assert b.continuations(ids[:2]) >= {ids[2]}
    with pytest.raises(InputError, match="need a tokenizer"):
        TemplatePhrasePenalty(phrases=["the lungs are clear"]).bind(None)


# --- loading from a local folder -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["encoder-decoder", "chat", "text"])
def test_save_and_load_from_a_local_folder(tmp_path, images, kind):
    tiny = tiny_model(kind, seed=1)
    model, proc = tiny.model, tiny.processor
    model.save_pretrained(tmp_path / "m"); proc.save_pretrained(tmp_path / "m")
    paths = [str(images / f"{i}.png") for i in range(3)]
    mem = HFReportGenerator(model, proc, policy=short("G1"), kind=kind)(paths, ["Cough.", None, "Fever."])
    gen = HFReportGenerator.from_pretrained(tmp_path / "m", policy=short("G1"))
    assert gen.kind == kind and gen.system == "m"
    # the same weights, generation settings and tokenizer came back
    sd = model.state_dict()
    assert all(torch.equal(sd[k], v) for k,
               v in gen.model.state_dict().items()) and set(sd) == set(gen.model.state_dict())
    keys = ("eos_token_id", "pad_token_id", "decoder_start_token_id", "suppress_tokens")
    assert [getattr(gen.model.generation_config, k, None) for k in keys] == [getattr(model.generation_config, k, None)
                                                                             for k in keys]
    text = "Indication: cough. The lungs are clear."
    assert gen.tokenizer(text)["input_ids"] == HFReportGenerator(model, proc, kind=kind).tokenizer(text)["input_ids"]
    # and the same reports (compared on their first 10 words: another transformers/torch build may choose a different
    # attention kernel, whose rounding can flip a near-tie late in a random model's output)
    out = gen(paths, ["Cough.", None, "Fever."])
    assert [r.split()[:10] for r in out] == [r.split()[:10] for r in mem]


def test_missing_model_folder_is_refused_without_download(tmp_path):
    with pytest.raises(InputError, match="model folder not found .*never downloads"):
        HFReportGenerator.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no config.json"):
        HFReportGenerator.from_pretrained(tmp_path / "empty")


def test_multi_image_samples_on_the_chat_model(chat, images):
    st = pd.DataFrame({"study_id": ["a", "b"],
                       "image_paths": [[str(images / "0.png"), str(images / "1.png")], [str(images / "2.png")]]})
    t = generate_table(chat, st, short("G1"), max_images=2, progress=False)
    assert t.error.isna().all()
    one = generate_table(chat, st, short("G1"), max_images=1, progress=False)
    assert t.hypothesis[1] == one.hypothesis[1]   # study b has one image either way


def test_progress_bar_goes_to_stderr(capsys, studies):
    corpus = make_demo_corpus(n_patients=2, seed=0)
    generate_table(SimulatedGenerator("sim-terse", corpus), corpus.studies, "B4", progress=True)
    cap = capsys.readouterr()
    assert cap.out == "" and "generate sim-terse" in cap.err


# --- DICOM ------------------------------------------------------------------------------------------------------

def test_dicom_files_load_when_pydicom_is_installed(tmp_path):
    pytest.importorskip("pydicom")
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.1"
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(tmp_path / "x"), {}, file_meta=meta, preamble=b"\0" * 128)
    arr = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 50)
    ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 1, 16, 16, 15
    ds.PixelRepresentation, ds.PhotometricInterpretation, ds.PixelData = 0, "MONOCHROME1", arr.tobytes()
    ds.save_as(str(tmp_path / "img"), enforce_file_format=True)   # no suffix: found by the DICM marker
    im = np.asarray(load_image(tmp_path / "img"))
    assert im.shape == (8, 8, 3) and im[0, 0, 0] == 255 and im[-1, -1, 0] == 0   # MONOCHROME1 inverted


# --- checkpoints ------------------------------------------------------------------------------------------------

def test_a_crashed_run_resumes_from_its_checkpoint(tmp_path):
    corpus = make_demo_corpus(n_patients=4, seed=1)
    n = len(corpus.studies)

    class Crashing(SimulatedGenerator):
        calls = 0
        def generate_batch(self, imgs, indications=None, **kw):
            Crashing.calls += 1
            if Crashing.calls == 3: raise KeyboardInterrupt  # not an ordinary error: the run stops
            return super().generate_batch(imgs, indications, **kw)

    ck = tmp_path / "run.jsonl"
    with pytest.raises(KeyboardInterrupt):
        generate_table(Crashing("sim-omit", corpus), corpus.studies, "K50", seeds=[0], batch_size=2, checkpoint=ck,
                       progress=False)
    saved = len(ck.read_text().splitlines())
    assert saved == 4

    seen = []
    class Counting(SimulatedGenerator):
        def generate_batch(self, imgs, indications=None, **kw):
            seen.extend(imgs); return super().generate_batch(imgs, indications, **kw)
    resumed = generate_table(Counting("sim-omit", corpus), corpus.studies, "K50", seeds=[0], batch_size=2,
                             checkpoint=ck, progress=False)
    fresh = generate_table(SimulatedGenerator("sim-omit", corpus), corpus.studies, "K50", seeds=[0], batch_size=2,
                           progress=False)
    assert len(seen) == n - 4
    assert sha256_frame(resumed) == sha256_frame(fresh)
    # changed policy settings under the same name do not reuse old rows
    seen.clear()
    generate_table(Counting("sim-omit", corpus), corpus.studies, dataclasses.replace(POLICIES["K50"], top_k=10),
                   seeds=[0], checkpoint=ck, progress=False)
    assert len(seen) == n


# --- entries: the cohort's chosen image, one generation per entry -----------------------------------------------

def which_image(imgs):
    "A generator that names the image it was given."
    return [f"Report of {p}." for p in imgs]


@pytest.fixture(scope="module")
def iu_real():
    return load_iu_xray(IU_REAL)


def two_frontal_studies():
    text = "Heart size is normal. The lungs are clear without effusion or pneumothorax."
    return pd.DataFrame({"study_id": ["s1", "s2"], "patient_id": ["p1", "p2"], "split": ["test", "test"],
                         "image_paths": [["s1/ap.jpg", "s1/lat.jpg", "s1/pa.jpg"], ["s2/pa.jpg"]],
                         "image_views": [["AP", "LATERAL", "PA"], ["PA"]], "findings": [text, text],
                         "impression": ["Normal.", "Normal."]})


def test_two_frontal_entries_of_one_study_give_two_generations_of_their_own_images():
    studies = two_frontal_studies()
    cohort = recipe_004_mimic(studies).studies                 # image level: every PA/AP image is an entry
    assert cohort.entry_id.tolist() == ["s1/0", "s1/2", "s2/0"]
    t = generate_table(which_image, cohort, progress=False)
    assert t.study_id.tolist() == ["s1", "s1", "s2"] and t.entry_id.tolist() == cohort.entry_id.tolist()
    assert t.hypothesis.tolist() == ["Report of s1/ap.jpg.", "Report of s1/pa.jpg.", "Report of s2/pa.jpg."]
    assert t.sample_id.tolist() == [f"which_image/default/0/{e}" for e in cohort.entry_id] and t.error.isna().all()
    # a simulated system under search and sampling: every entry generated, sampled entries of one study seeded apart
    k = generate_table(SimulatedGenerator("sim-template", studies), cohort, ["B4", "K50"], seeds=[0, 1], progress=False)
    assert len(k) == 3 * len(cohort) and k.error.isna().all() and k.sample_id.is_unique
    assert k.groupby(["policy", "seed"]).entry_id.apply(list).map(tuple).nunique() == 1
    s1 = k[(k.policy == "K50") & (k.study_id == "s1")].sample_id
    assert len({sample_seed(0, s) for s in s1}) == len(s1)
    # keyed by study alone the same table is refused up front, naming the row (it used to fail after generating)
    with pytest.raises(InputError, match=r"studies: row 1: study_id 's1' repeats an earlier row"):
        generate_table(which_image, cohort.drop(columns="entry_id"), progress=False)


def test_a_lateral_first_study_is_generated_from_its_frontal_image(iu_real):
    lat_first = iu_real[iu_real.image_views.map(lambda v: list(v[:1]) == ["LATERAL"] and "FRONTAL" in list(v))]
    assert len(lat_first) >= 2                                  # real studies listed [lateral, frontal]
    chosen = Cohort(lat_first).select_views(FRONTAL_VIEWS, prefer="first", fallback="any").studies
    frontal = [f"Report of {ps[list(vs).index('FRONTAL')]}." for ps,
               vs in zip(lat_first.image_paths, lat_first.image_views)]
    assert generate_table(which_image, chosen, progress=False).hypothesis.tolist() == frontal
    # a table without a chosen image keeps the old rule (first listed image), and so does image_column=None
    first = [f"Report of {ps[0]}." for ps in lat_first.image_paths]
    assert frontal != first
    assert generate_table(which_image, lat_first, progress=False).hypothesis.tolist() == first
    assert generate_table(which_image, chosen, image_column=None, progress=False).hypothesis.tolist() == first
    # with more images per sample the chosen one comes first
    assert [ps[0] for ps in generation_inputs(chosen, max_images=None).images] == chosen.image_path.tolist()


def test_the_real_iu_fixture_runs_through_recipe_004_iu_and_generate_table(iu_real, tmp_path):
    cohort = recipe_004_iu(iu_real)
    entries = cohort.studies
    assert 0 < len(entries) < len(iu_real)
    run = lambda table: generate_table(SimulatedGenerator("sim-template", iu_real), table, ["B4", "G1", "K50"],
                                       seeds=[0, 1], progress=False)
    gen = run(entries)
    assert len(gen) == 4 * len(entries) and gen.error.isna().all() and gen.sample_id.is_unique
    assert (gen.hypothesis.str.strip() != "").all()
    assert gen.entry_id.tolist() == gen.study_id.tolist() == entries.study_id.tolist() * 4  # study level: entry = study
    assert sha256_frame(run(entries)) == sha256_frame(gen)
    # every entry went to the generator with the image the cohort chose
    assert generate_table(which_image, entries,
                          progress=False).hypothesis.tolist() == [f"Report of {p}." for p in entries.image_path]
    # the cohort as written to disk (what `cxr-audit cohort` writes and `cxr-audit generate` reads) gives the same table
    write_cohort(cohort, tmp_path / "c")
    assert sha256_frame(run(pd.read_parquet(tmp_path / "c/cohort.parquet"))) == sha256_frame(gen)


def test_every_frontal_image_of_the_real_iu_fixture_is_generated_as_an_entry(iu_real):
    entries = Cohort(iu_real).explode_images().select_views(FRONTAL_VIEWS, fallback="none").studies
    t = generate_table(SimulatedGenerator("sim-terse", iu_real), entries, "B4", progress=False)
    assert len(t) == len(entries) and t.error.isna().all() and t.entry_id.is_unique
    assert (t.entry_id.tolist() == entries.entry_id.tolist()
            and t.study_id.tolist() == entries.study_id.astype(str).tolist())
    sent = generate_table(which_image, entries, progress=False).hypothesis
    assert sent.tolist() == [f"Report of {p}." for p in entries.image_path]


# --- simulated systems ------------------------------------------------------------------------------------------

def test_simulated_template_system_collapses_more_under_beam_search():
    corpus = make_demo_corpus(n_patients=30, seed=2)
    gen = SimulatedGenerator("sim-template", corpus)
    anti = dataclasses.replace(POLICIES["B4"], name="B4-anti", processors=(TemplatePhrasePenalty(),))
    t = generate_table(gen, corpus.studies, ["B4", "G1", "K50", anti], seeds=[0, 1, 2], progress=False)
    s = policy_summary(t).set_index("policy")
    assert s.distinct["B4"] < s.distinct["G1"] < s.distinct["K50"]
    assert s.distinct["B4-anti"] > s.distinct["B4"]
    assert s.top_share["B4"] > s.top_share["K50"]
    k50 = t[t.policy == "K50"]
    assert (k50.hypothesis == "").any() and (k50.hypothesis == "<unk>").any() and k50.truncated.any()
    assert (k50.n_tokens[k50.truncated] == POLICIES["K50"].max_new_tokens).all()
    assert not t[t.policy != "K50"].truncated.any() and (t[t.policy != "K50"].hypothesis != "").all()
    # deterministic policies: same report for a study whatever the seed; sampling: seeds differ
    b4 = generate_table(gen, corpus.studies, "B4", seeds=[0, 1], repeat_deterministic=True, progress=False)
    h = b4.pivot(index="study_id", columns="seed", values="hypothesis")
    assert (h[0] == h[1]).all()
    h = k50.pivot(index="study_id", columns="seed", values="hypothesis")
    assert (h[0] != h[1]).mean() > 0.3


# --- optional dependencies --------------------------------------------------------------------------------------

def test_module_imports_without_torch_and_transformers():
    code = textwrap.dedent("""
        import sys
        for m in ("torch", "transformers", "tokenizers"): sys.modules[m] = None   # make them unimportable
        import cxr_audit.generate as g
        from cxr_audit.synth import make_demo_corpus
        assert g.POLICIES["B4"].to_generate_kwargs()["num_beams"] == 4
        c = make_demo_corpus(n_patients=2, seed=0)
        t = g.generate_table(g.SimulatedGenerator("sim-template", c), c.studies, "B4,K50", progress=False)
        assert t.error.isna().all()
        try: g.tiny_model()
        except ImportError as e: assert 'pip install "cxr_audit[generate]"' in str(e) and "tiny_model" in str(e), e
        else: raise AssertionError("tiny_model worked without torch")
        try: g.DecodingPolicy("x", processors=[g.RecurrencePenalty()]).to_generate_kwargs()
        except ImportError as e: assert "cxr_audit[generate]" in str(e)
        else: raise AssertionError("to_generate_kwargs with processors worked without transformers")
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_importing_the_module_does_not_import_torch():
    code = ("import sys, cxr_audit.generate; print(sorted(m for m in ('torch', 'transformers', 'PIL', 'yaml') if m in "
            "sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
