"""A plain-Python reference of the per-report rules of `cxr_audit.concentration`, written without the library's code:
word tokens, the normalization used for matching, the validity reasons, and numpy's default quantile.
It is the baseline of bench_concentration.py and the oracle of tests/test_concentration.py (which loads this file)."""
import re

from cxr_audit.concentration import VALIDITY_RULES
from cxr_audit.core import is_missing

TOKEN = re.compile(r"[^\W_]+")
SPECIAL = re.compile("|".join(f"(?:{re.escape(t)})" for t in VALIDITY_RULES["special_tokens"])
                     + "".join(f"|(?:{p})" for p in VALIDITY_RULES["special_patterns"]))
WS = re.compile(r"\s+")


def tokens(text) -> list[str]:
    "Lower-cased runs of letters and digits; none for a value that is not text."
    return [w.lower() for w in TOKEN.findall(text)] if isinstance(text, str) else []


def normalize(text) -> str:
    "Lower case, white space folded, trailing punctuation dropped ('' for a value that is not text)."
    s = text if isinstance(text, str) else ""
    return WS.sub(" ", s.lower()).strip().rstrip(".,;:!? \t\n\r\f\v")


def ngram_repeats(toks: list, n: int) -> tuple[int, int]:
    "How many n-grams `toks` has, and how many of them repeat an earlier one."
    grams = list(zip(*[toks[j:] for j in range(n)]))
    return len(grams), len(grams) - len(set(grams))


def reasons(text, cut: bool = False, rules: dict = VALIDITY_RULES, toks: list | None = None,
            repeats: tuple[int, int] | None = None) -> list[str]:
    """Why a report is invalid, in the audit's order (none: valid). `cut`: it stopped at the token limit; `toks` and
    `repeats` (`ngram_repeats(toks, rules["loop_n"])`) may be passed when already computed."""
    toks = tokens(text) if toks is None else toks
    out = []
    if is_missing(text): out.append("missing")
    elif not isinstance(text, str): out.append("not_text")
    else:
        special = bool(SPECIAL.search(text))
        words = len(tokens(SPECIAL.sub(" ", text))) if special else len(toks)
        if text == "": out.append("empty")
        elif not toks: out.append("no_words")
        if special: out.append("special_token")
        if any(c in text for c in rules["bad_characters"]): out.append("bad_character")
        if text and toks and words < rules["min_words"]: out.append("too_few_words")
    if cut: out.append("token_limit")
    total, repeated = ngram_repeats(toks, rules["loop_n"]) if repeats is None else repeats
    if isinstance(text, str) and total >= rules["loop_min_ngrams"] and repeated >= rules["loop_share"] * total:
        out.append("looping")
    return out


def quantile(values, q: float) -> float:
    "numpy's default (linear) quantile of `values`."
    v = sorted(values); n = len(v); x = n * q + (1 + q * (1 - 1 - 1)) - 1
    lo = int(x // 1); hi = min(lo + 1, n - 1); w = x - lo; a, b = v[lo], v[hi]
    return b - (b - a) * (1 - w) if w >= 0.5 else a + (b - a) * w
