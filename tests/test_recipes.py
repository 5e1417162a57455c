"""Generator recipes (`cxr_audit.generate`): the registry, `load_generator`, and the input builders, on tiny random
models.

Where the architecture is in transformers, the recipe is run end to end: a tiny randomly initialised model of the same
class is saved to a folder the way a downloaded checkpoint is, loaded through the recipe's own loading code
(`load_generator`) and run on image files:
- `medgemma`: `Gemma3ForConditionalGeneration` with a real `Gemma3Processor` (`tiny_gemma3`);
- `chex-mimic`: `VisionEncoderDecoderModel` with a ViT encoder and a BERT decoder, an image processor and a tokenizer.

MAIRA-2 and CheXagent-2 need code that ships with their checkpoints (`trust_remote_code`), which cannot be loaded here
(no checkpoint, and their code targets older transformers releases). Their tests cover everything up to the model:
`load_generator`'s checks, and the inputs `Maira2Inputs` / `CheXagentInputs` build. The classes that ship with the
checkpoints are replaced by stand-ins, said where they are used: for MAIRA-2 a LLaVA processor with a
`format_reporting_input` of the official signature, and the tiny LLaVA model (MAIRA-2 is LLaVA-style); for CheXagent-2
the tiny tokenizer with a `from_list_format` and a `from`/`value` chat template, and a tiny GPT-2 (CheXagent-2's own
model would read the images from the paths in its prompt).
"""
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from cxr_audit.core import InputError  # noqa: E402
from cxr_audit.recipes import (GENERATOR_RECIPES, MEDGEMMA_PROMPT, CheXagentInputs, GeneratorRecipe, Maira2Inputs,  # noqa: E402
                               generator_recipe, load_generator, recipes_frame, tiny_gemma3)
from cxr_audit.generate import (SECTIONS_HEADER, TINY_VOCAB, DecodingPolicy, HFReportGenerator, call_report_generator,  # noqa: E402
                                generate_table, image_file, tiny_model, tiny_tokenizer, with_indication)

SHORT = DecodingPolicy("greedy-8", max_new_tokens=8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread (conftest)


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    "Four small grey PNG files, as a study folder holds them."
    d = tmp_path_factory.mktemp("pngs")
    out = []
    for i in range(4):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (48, 40), dtype=np.uint8)).save(d / f"{i}.png")
        out.append(str(d / f"{i}.png"))
    return out


@pytest.fixture(scope="module")
def medgemma_dir(tmp_path_factory):
    "A tiny Gemma 3 image-text model saved like a downloaded MedGemma checkpoint."
    d = tmp_path_factory.mktemp("ckpt") / "medgemma-4b-it"
    tg = tiny_gemma3()
    tg.model.save_pretrained(d); tg.processor.save_pretrained(d)
    return d, tg


# --- the registry ------------------------------------------------------------------------------------------------

def test_registry_names_models_classes_and_sources():
    assert list(GENERATOR_RECIPES) == ["medgemma", "maira2", "chexagent", "chex-mimic"]
    ids = {n: r.model_ids[0] for n, r in GENERATOR_RECIPES.items()}
    assert ids == {"medgemma": "google/medgemma-4b-it", "maira2": "microsoft/maira-2",
                   "chexagent": "StanfordAIMI/CheXagent-2-3b",
                   "chex-mimic": "IAMJB/chexpert-mimic-cxr-findings-baseline"}
    for r in GENERATOR_RECIPES.values():
        assert r.sources.startswith("paper 000 App. D."), r.name  # every recipe says where its settings come from
        for cls in [r.model_class, *r.processor_class.split("+")]:  # the loading classes exist in transformers
            assert hasattr(transformers, cls), (r.name, cls)
    assert [r.name for r in GENERATOR_RECIPES.values() if r.remote_code] == ["maira2", "chexagent"]
    assert (generator_recipe("MAIRA2").max_images, generator_recipe("chexagent").max_images,
            generator_recipe("medgemma").max_images) == (2, 2, 1)
    # paper 004's pinned revision
    assert "91850547d9f0b2fdd21aa7c5f4f3d1a8a52c243b" in generator_recipe("medgemma").sources
    with pytest.raises(InputError, match="unknown generator recipe 'libra'"):
        generator_recipe("libra")


def test_recipes_frame_and_markdown():
    rf = recipes_frame()
    assert rf.name.tolist() == list(GENERATOR_RECIPES)
    assert rf.set_index("name").loc["chexagent", "install"].count("transformers==4.40.0") == 1
    md = generator_recipe("maira2")._repr_markdown_()
    assert "written by the model's processor" in md and "trust_remote_code=True" in md


def test_recipe_settings_are_wrapper_settings():
    tm = tiny_model("chat")
    for r in GENERATOR_RECIPES.values():
        g = HFReportGenerator(tm.model, tm.processor, **r.settings())
        assert (g.system, g.policy.name, g.max_images, g.input_builder) == (r.name, r.policy.name, r.max_images,
                                                                            r.input_builder)
    with pytest.raises(InputError, match="batch_size must be a positive integer"):
        GeneratorRecipe(name="x", title="x", model_ids=("x",), architecture="x", model_class="x", processor_class="x",
                        kind="chat", policy="G1", batch_size=0)


def test_prompts_take_the_sections():
    ctx = {"indication": "Cough and fever.", "technique": "PA view.", "comparison": ""}
    p = with_indication(MEDGEMMA_PROMPT, ctx)
    assert (f"{SECTIONS_HEADER}\n\nINDICATION: Cough and fever.\n\nTECHNIQUE: PA view.\n\n" in p
            and "COMPARISON" not in p)
    assert "{" not in with_indication(MEDGEMMA_PROMPT,
                                      None) and SECTIONS_HEADER not in with_indication(MEDGEMMA_PROMPT, None)
    ca = generator_recipe("chexagent")
    assert with_indication(ca.prompt, "Cough.", missing=ca.input_builder.missing) == \
        'Given the indication: "Cough", write a structured findings section for the CXR.'
    assert with_indication(ca.prompt, None, missing=ca.input_builder.missing).startswith('Given the indication: "",')


def test_mappings_of_sections_reach_the_generator():
    seen = []
    def gen(imgs, indications=None):
        seen.extend(indications); return ["x"] * len(imgs)
    call_report_generator(gen, ["a", "b", "c"], [{"indication": "Cough."}, {"technique": " "}, "Fever."])
    assert seen == [{"indication": "Cough."}, None, "Fever."]                      # an all-blank mapping counts as none


# --- load_generator: checks before loading ---------------------------------------------------------------------------

def test_missing_folder_and_config_say_how_to_get_the_checkpoint(tmp_path):
    with pytest.raises(InputError, match=r"model folder not found.*huggingface-cli download microsoft/maira-2 "
                                         r"--local-dir"):
        load_generator("maira2", tmp_path / "maira-2")
    with pytest.raises(InputError, match="no config.json"):
        load_generator("medgemma", tmp_path)


def test_remote_code_must_be_allowed(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for name in ("maira2", "chexagent"):
        with pytest.raises(InputError, match="pass trust_remote_code=True"):
            load_generator(name, tmp_path)
    with pytest.raises(InputError, match="the model's processor writes the prompt"):
        load_generator("maira2", tmp_path, trust_remote_code=True, prompt="Describe the image.")
    with pytest.raises(InputError, match="unknown dtype 'fp-something'"):
        load_generator("medgemma", tmp_path, dtype="fp-something")


def test_a_transformers_without_the_class_names_the_install_line(medgemma_dir):
    # a transformers release without the recipe's class (Gemma 3 arrived in 4.50): here, a class no release has
    r = dataclasses.replace(generator_recipe("medgemma"), model_class="AutoModelForNothingYet")
    with pytest.raises(ImportError, match=r'needs transformers >=4.50.*has no AutoModelForNothingYet.*pip install -e '
                                          r'"\.\[generate\]"'):
        load_generator(r, medgemma_dir[0], device="cpu")


def test_without_torch_the_error_names_the_extra(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        from cxr_audit.recipes import load_generator
        try: load_generator("medgemma", {str(tmp_path)!r})
        except ImportError as e: print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert ("load_generator('medgemma') needs the optional package 'torch'" in out
            and 'pip install -e ".[generate]"' in out)


# --- medgemma, end to end on a tiny Gemma 3 ---------------------------------------------------------------------------

def test_medgemma_loads_through_its_recipe_and_writes_reports(medgemma_dir, pngs):
    folder, tg = medgemma_dir
    med = load_generator("medgemma", folder, device="cpu", policy=SHORT)
    assert (type(med.model).__name__, type(med.processor).__name__, med.model.dtype) == \
        ("Gemma3ForConditionalGeneration", "Gemma3Processor", torch.float32)
    assert (med.system, med.kind, med.prompt, med.max_images, med.batch_size) == ("medgemma", "chat", MEDGEMMA_PROMPT,
                                                                                  1, 4)
    assert all(torch.equal(v, tg.model.state_dict()[k]) for k, v in med.model.state_dict().items())
    ctx = [{"indication": "Cough.", "comparison": "None."}, None, "Fever.", None]
    out = med.generate_batch(pngs, ctx)
    assert all(isinstance(g.text, str) and g.n_tokens <= 8 and g.truncated == (g.n_tokens == 8) for g in out)
    assert [g.text for g in out] == [med([p], [c])[0] for p, c in zip(pngs, ctx)]      # batching changes nothing
    assert [g.text for g in out] == [g.text for g in med.generate_batch(pngs, ctx)]     # greedy: the same again
    assert len({med([p])[0] for p in pngs}) > 1                                         # the image reaches the model
    assert med([pngs[1]], [ctx[0]]) != med([pngs[1]])                                   # and so do the sections


def test_medgemma_runs_in_generate_table_and_in_bfloat16(medgemma_dir, pngs):
    folder, _ = medgemma_dir
    med = load_generator("medgemma", folder, device="cpu", dtype="bfloat16", policy=SHORT, batch_size=2)
    assert med.model.dtype == torch.bfloat16  # pixel values follow the weights
    studies = pd.DataFrame({"study_id": ["s0", "s1", "s2"], "image_paths": [[p] for p in pngs[:3]],
                            "indication": ["Cough.", None, "Fever."]})
    g = generate_table(med, studies, use_indication=True, progress=False)
    assert (g.error.isna().all() and g.system.unique().tolist() == ["medgemma"]
            and g.policy.unique().tolist() == ["greedy-8"])
    assert g.study_id.tolist() == ["s0", "s1", "s2"]


def test_the_evaluator_takes_a_recipe_generator(medgemma_dir, pngs):
    from cxr_audit.evaluator import ReportGenerationEvaluator
    med = load_generator("medgemma", medgemma_dir[0], device="cpu", policy=SHORT)
    ds = [{"img": p, "report": f"INDICATION: Cough.\nFINDINGS: The lungs are clear {i}.\nIMPRESSION: Normal."} for i,
          p in enumerate(pngs[:3])]
    ev = ReportGenerationEvaluator(med, dataset=ds, metrics=["bleu"], use_indication=True)
    g = ev.generate()
    assert ev.arity == 2 and g.status.eq("scored").all()
    assert g.hypothesis.tolist() == med(pngs[:3], ["Cough."] * 3)  # the parsed indication reached the prompt
    assert ev.evaluate().bleu.notna().all()


# --- chex-mimic, end to end on a tiny ViT + BERT encoder-decoder
# -------------------------------------------------------

@pytest.fixture(scope="module")
def chex_mimic_dir(tmp_path_factory):
    """A tiny VisionEncoderDecoderModel (ViT + BERT decoder) saved with its image processor and tokenizer, no decoder
    start token set."""
    tf, d = transformers, tmp_path_factory.mktemp("ckpt") / "chexpert-mimic-cxr-findings-baseline"
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 initializer_range=0.5)
    vit = tf.ViTConfig(image_size=32, patch_size=8, num_channels=3, **small)
    bert = tf.BertConfig(vocab_size=len(TINY_VOCAB), max_position_embeddings=256, is_decoder=True,
                         add_cross_attention=True, pad_token_id=0, **small)
    torch.manual_seed(0)
    config = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(vit, bert)
    model = tf.VisionEncoderDecoderModel(config=config).eval()
    model.generation_config.suppress_tokens = [0, 1, 2, 4]
    model.save_pretrained(d)
    (getattr(tf, "ViTImageProcessorPil", None)
     or tf.ViTImageProcessor)(size={"height": 32, "width": 32}).save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


def test_chex_mimic_loads_through_its_recipe_and_ignores_text(chex_mimic_dir, pngs):
    gen = load_generator("chex-mimic", chex_mimic_dir, device="cpu",
                         policy=DecodingPolicy("B2-8", num_beams=2, max_new_tokens=8))
    assert (type(gen.model).__name__, gen.kind, gen.prompt, gen.system) == ("VisionEncoderDecoderModel",
                                                                            "encoder-decoder", "", "chex-mimic")
    assert isinstance(gen.processor, tuple) and gen.image_processor is not None
    # from the tokenizer
    assert (gen.model.generation_config.decoder_start_token_id, gen.model.generation_config.eos_token_id) == (2, 3)
    reports = gen(pngs)
    assert len(reports) == 4 and all(isinstance(r, str) for r in reports) and len(set(reports)) > 1
    assert gen(pngs, ["Cough.", None, "Fever.", "Pain."]) == reports                    # the model takes no text


# --- maira2: up to the model, with a stand-in for its own processor --------------------------------------------------

class StandInMaira2Processor(transformers.LlavaProcessor):
    """Stand-in for MAIRA-2's processor (code that ships with the checkpoint): its method's signature, a plain prompt,
    a record."""
    calls = []

    def format_reporting_input(self, current_frontal, current_lateral, prior_frontal, indication, technique, comparison,
                               prior_report, get_grounding=False, assistant_text=None):
        self.calls.append(dict(frontal=current_frontal.size,
                               lateral=None if current_lateral is None else current_lateral.size, prior=prior_frontal,
                               indication=indication, technique=technique, comparison=comparison,
                               prior_report=prior_report, grounding=get_grounding))
        ims = [current_frontal] + ([current_lateral] if current_lateral is not None else [])
        text = {"type": "text", "text": f"findings . {indication}"}
        msg = [{"role": "user", "content": [{"type": "image"} for _ in ims] + [text]}]
        return self.apply_chat_template(msg, add_generation_prompt=True, tokenize=False), ims


@pytest.fixture
def maira_like():
    tm = tiny_model("chat")   # LLaVA-style like MAIRA-2 (whose image encoder is RAD-DINO and projector deeper)
    p = tm.processor
    proc = StandInMaira2Processor(image_processor=p.image_processor, tokenizer=p.tokenizer, patch_size=8,
                                  vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                  chat_template=p.chat_template)
    proc.calls = []
    return HFReportGenerator(tm.model, proc, **{**generator_recipe("maira2").settings(), "policy": SHORT,
                                                "batch_size": 3}), proc


def test_maira2_inputs_frontal_lateral_and_sections(maira_like, pngs):
    gen, proc = maira_like
    lateral = np.zeros((30, 20), dtype=np.uint8)
    inputs, n = Maira2Inputs()(gen, [[pngs[0], lateral, pngs[2]], pngs[1]],
                               [{"indication": "Dyspnea.", "comparison": "None."}, None])
    assert proc.calls == [
        dict(frontal=(40, 48), lateral=(20, 30), prior=None, indication="Dyspnea.", technique=None, comparison="None.",
             prior_report=None, grounding=False),
        dict(frontal=(40, 48), lateral=None, prior=None, indication=None, technique=None, comparison=None,
             prior_report=None, grounding=False)]
    # a third image is not given to MAIRA-2
    assert inputs["pixel_values"].shape[0] == 3 and inputs["input_ids"].shape == (2, n)
    assert inputs["attention_mask"][1, 0] == 0 and inputs["attention_mask"][:, -1].tolist() == [1, 1]   # left padding
    assert Maira2Inputs(get_grounding=True).call_args([pngs[0]], None)["get_grounding"] is True


def test_maira2_recipe_generates_through_the_processor(maira_like, pngs):
    gen, proc = maira_like
    samples, ctx = [[pngs[0], pngs[1]], pngs[2], pngs[3]], ["Cough.", None, {"technique": "AP portable."}]
    out = gen.generate_batch(samples, ctx)
    assert len(out) == 3 and all(g.n_tokens <= 8 for g in out)
    assert [g.text for g in out] == [gen([s], [c])[0] for s, c in zip(samples, ctx)]
    assert len(proc.calls) == 6


def test_maira2_without_its_processor_says_to_allow_its_code(pngs):
    tm = tiny_model("chat")
    gen = HFReportGenerator(tm.model, tm.processor, **{**generator_recipe("maira2").settings(), "policy": SHORT})
    with pytest.raises(InputError, match=r"no format_reporting_input.*trust_remote_code=True"):
        gen([pngs[0]])


# --- chexagent: up to the model, with a stand-in for its own tokenizer ------------------------------------------------

def stand_in_chexagent_tokenizer():
    """Stand-in for CheXagent-2's tokenizer (code that ships with the checkpoint): `from_list_format` and a from/value
    chat template."""
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['from'] }} : {{ m['value'] }} . {% endfor %}"
                         "{% if add_generation_prompt %}assistant : {% endif %}")
    tok.from_list_format = lambda items: "".join(f"Picture {i}: <img>{x['image']}</img>\n" if "image" in x
                                                 else x["text"]
                                                 for i, x in enumerate(items, 1))
    return tok


def test_chexagent_inputs_write_image_files_into_the_conversation(tmp_path, pngs):
    tok, cx = stand_in_chexagent_tokenizer(), CheXagentInputs(image_dir=str(tmp_path))
    arr = np.random.default_rng(9).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    gpt2 = tiny_model("text").model      # stands in for CheXagent-2's model, which reads the images from the paths
    gen = HFReportGenerator(gpt2, tok, **{**generator_recipe("chexagent").settings(), "policy": SHORT,
                                          "input_builder": cx})
    inputs, n = cx(gen, [[pngs[0], arr, pngs[1]], pngs[2]], ["Cough.", None])
    written = sorted(tmp_path.glob("*.png"))
    assert len(written) == 1  # the array; PNG files are used as they are
    first = str(Path(pngs[0]).resolve())
    conv = cx.conversation(tok, [first, str(written[0])], with_indication(gen.prompt, "Cough.", missing=""))
    assert conv[0] == {"from": "system", "value": "You are a helpful assistant."}
    assert conv[1]["value"] == (f"Picture 1: <img>{first}</img>\nPicture 2: <img>{written[0]}</img>\n"
                                'Given the indication: "Cough", write a structured findings section for the CXR.')
    expect = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)["input_ids"]
    row = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].tolist()
    assert row == expect and inputs["input_ids"].shape == (2, n)                        # the third image was dropped
    out = gen.generate_batch([[pngs[0], arr], pngs[2]], ["Cough.", None])
    assert len(out) == 2 and all(g.n_tokens <= 8 for g in out)


def test_chexagent_without_its_tokenizer_says_to_allow_its_code(pngs):
    tm = tiny_model("text")
    gen = HFReportGenerator(tm.model, tm.processor, **{**generator_recipe("chexagent").settings(), "policy": SHORT})
    with pytest.raises(InputError, match=r"no from_list_format.*trust_remote_code=True"):
        gen([pngs[0]])


# --- image files for models that read files ---------------------------------------------------------------------------

def test_image_file_converts_only_what_needs_it(tmp_path):
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(tmp_path / "grey.png")
    assert image_file(tmp_path / "grey.png", folder=tmp_path / "out") == str((tmp_path / "grey.png").resolve())
    Image.fromarray((np.arange(64, dtype=np.uint16) * 900).reshape(8, 8)).save(tmp_path / "deep.png")
    f = image_file(tmp_path / "deep.png", folder=tmp_path / "out")
    assert Image.open(f).mode == "RGB" and np.asarray(Image.open(f))[..., 0].max() == 255   # 16-bit stretched to 8 bits
    assert image_file(np.asarray(Image.open(f)), folder=tmp_path / "out") == f             # same pixels, same file
    assert [p.name for p in (tmp_path / "out").iterdir()] == [Path(f).name]                # written once
    with pytest.raises(InputError, match="image file not found"):
        image_file(tmp_path / "missing.png", folder=tmp_path)


def test_paper_001_example_runs_with_its_documented_names(medgemma_dir, pngs, tmp_path):
    """Paper 001's usage, name for name: a `make_*_generator` recipe giving (transform, report_generator), the evaluator
    from
    the "report_generation" registry key, evaluate / save_results / generate_only (a tiny MedGemma-shaped model; offline
    metrics)."""
    from cxr_audit.evaluator import get_evaluator, make_medgemma_generator
    folder, _ = medgemma_dir
    transform, report_generator = make_medgemma_generator(device="cpu", model_path=folder, policy=SHORT)
    ds = [transform({"img": p, "study_id": f"s{i}",
                     "report": f"FINDINGS: The lungs are clear {i}. IMPRESSION: Normal."})
          for i, p in enumerate(pngs)]
    assert all(Path(s["img"]).is_file() for s in ds)
    ev = get_evaluator("report_generation")(report_generator, dataset=ds, ref_section="findings",
                                            metrics=("bleu_4", "rouge_l"), n_bootstrap=5,
                                            output_dir=str(tmp_path / "out"))
    df = ev.evaluate()
    ev.save_results(df)
    assert {"results.csv", "results_summary.csv", "generations.csv"} <= {p.name for p in (tmp_path / "out").iterdir()}
    assert ((df.label == "report").all() and (df.fold == -1).all()
            and sorted(df.bootstrap.unique()) == [-1, 0, 1, 2, 3, 4])
    pairs = pd.read_parquet(ev.generate_only(tmp_path / "out" / "pairs.parquet"))
    assert pairs.columns.tolist() == ["sample_id", "reference", "hypothesis"] and len(pairs) >= 1
