"""Cross-checks of cxr_audit.stats against naive loops, scipy, statsmodels and pingouin (test-only dependency).

The notebook (nbs/04_stats.ipynb) holds the fast worked examples; the slower checks live here: the coverage
simulation, many random cases against the reference libraries, and the exact-equality checks on larger inputs.
"""
import warnings
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from statsmodels.stats.inter_rater import cohens_kappa
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from cxr_audit.core import DEFAULT_SEED, InputError, sha256_frame
from cxr_audit.stats import (DegenerateIntervalWarning, ComparisonFamily, comparison_family, p_value_floor,
                             proportion_stats, agreement_stats, agreement_table, binomial_cis, bootstrap,
                             bootstrap_distinct, bootstrap_metrics, kendall_tau, micro_precision,
                             spearman,
                             cohen_kappa, corpus_bleu, count_reversals, distinct_replicates, distinct_stats,
                             exact_binomial_ci,
                             gwet_ac1, holm, holm_family, icc2_1, incidence, kendalls_w, macro_f1, macro_stats,
                             mean_stats, micro_f1, micro_stats, paired_bootstrap, percent_agreement, quadratic_kappa,
                             rank_ci, rater_agreement, replicate_ranks, replicate_sums, resample_indices,
                             resample_weights, within_one)


def _bounds(ci: pd.DataFrame) -> np.ndarray:
    "The `[ci_low, ci_high]` of a one-row `conf_int()` table."
    return ci[["ci_low", "ci_high"]].to_numpy(dtype=float)[0]


# ---------------------------------------------------------------- exact equality with the naive evaluator loop
def test_mean_equals_naive_loop_exactly():
    x = np.round(np.random.default_rng(0).normal(0.5, 0.2, 500) * 256) / 256  # dyadic: every sum is exact
    res = bootstrap(mean_stats(x), "mean", reps=3000, seed=2026)
    naive = np.array([x[i].mean() for i in resample_indices(500, 3000, seed=2026)])
    assert np.array_equal(res.replicates, naive)


def test_micro_and_macro_f1_equal_naive_loop_exactly():
    g = np.random.default_rng(1)
    y_true, y_pred = g.random((400, 14)) < 0.2, g.random((400, 14)) < 0.25
    tp, fp, fn = (y_true & y_pred), (~y_true & y_pred), (y_true & ~y_pred)
    micro = bootstrap(micro_stats(tp.sum(1), fp.sum(1), fn.sum(1)), micro_f1, reps=1000, seed=3)
    macro = bootstrap(macro_stats(tp, fp, fn), macro_f1, reps=1000, seed=3)
    naive_micro, naive_macro = [], []
    for i in resample_indices(400, 1000, seed=3):
        t, p = y_true[i], y_pred[i]
        a, b, c = (t & p).sum(), (~t & p).sum(), (t & ~p).sum()
        naive_micro.append(2 * a / (2 * a + b + c))
        a, b, c = (t & p).sum(0), (~t & p).sum(0), (t & ~p).sum(0)
        den = 2 * a + b + c
        f1 = np.where(den > 0, 2 * a / np.where(den > 0, den, 1), 0.0)
        acc = 0.0
        for v in f1: acc += v                          # classes added in order, as documented
        naive_macro.append(acc / len(f1))
    assert np.array_equal(micro.replicates, np.array(naive_micro))
    assert np.array_equal(macro.replicates, np.array(naive_macro))


def _ngrams(toks, k):
    return Counter(tuple(toks[i:i + k]) for i in range(len(toks) - k + 1))


def _pair_counts(ref, hyp, N):
    m = [sum((_ngrams(hyp, k) & _ngrams(ref, k)).values()) for k in range(1, N + 1)]
    return m + [max(len(hyp) - k + 1, 0) for k in range(1, N + 1)] + [len(hyp), len(ref)]


def _naive_bleu(pairs, N):
    tot = np.sum([_pair_counts(r, h, N) for r, h in pairs], axis=0).astype(float)
    s = 0.0
    with np.errstate(divide="ignore"):                    # an empty n-gram order gives log(0) = -inf, BLEU 0
        for k in range(N): s += np.log(tot[k] / tot[N + k])  # numpy scalars: same rounding as the vectorized log
    c, r = tot[2 * N], tot[2 * N + 1]
    return (np.exp(1 - r / c) if c < r else 1.0) * np.exp(s / N)


@pytest.mark.parametrize("clustered", [False, True])
def test_bleu_like_ratio_equals_naive_loop_exactly(clustered):
    g = np.random.default_rng(4)
    vocab = "no acute cardiopulmonary process heart size normal lungs are clear small left pleural effusion".split()
    refs = [list(g.choice(vocab, g.integers(5, 15))) for _ in range(120)]
    hyps = [list(g.choice(vocab, g.integers(3, 15))) for _ in range(120)]
    S = np.array([_pair_counts(r, h, 4) for r, h in zip(refs, hyps)], dtype=float)
    clusters = np.arange(120) // 3 if clustered else None
    res = bootstrap(S, corpus_bleu, reps=200, seed=7, clusters=clusters)
    assert res.estimate == _naive_bleu(list(zip(refs, hyps)), 4)
    if clustered:
        members = [np.arange(c * 3, c * 3 + 3) for c in range(40)]
        draws = [np.concatenate([members[c] for c in d]) for d in resample_indices(40, 200, seed=7)]
    else:
        draws = resample_indices(120, 200, seed=7)
    naive = [_naive_bleu([(refs[i], hyps[i]) for i in d], 4) for d in draws]
    assert np.array_equal(res.replicates, np.array(naive))


def test_paired_differences_equal_naive_paired_loop():
    g = np.random.default_rng(5)
    n = 300
    counts = {s: (g.integers(0, 5, n), g.integers(0, 3, n), g.integers(0, 3, n)) for s in "ABC"}
    res = paired_bootstrap({s: micro_stats(*c) for s, c in counts.items()}, "micro_f1", reps=500, seed=11)

    def f1(c, i):
        tp, fp, fn = (v[i].sum() for v in c)
        return 2 * tp / (2 * tp + fp + fn)
    idx = resample_indices(n, 500, seed=11)
    for k, (a, b) in enumerate(res.pairs):
        sa, sb = res.systems[a], res.systems[b]
        naive = np.array([f1(counts[sa], i) - f1(counts[sb], i) for i in idx])
        assert np.array_equal(res.differences[k], naive)


# ---------------------------------------------------------------- weights
def test_cluster_weights_equal_explicit_cluster_resample():
    g = np.random.default_rng(6)
    labels = g.choice([f"p{i}" for i in range(37)], size=200)          # uneven cluster sizes
    codes, uniq = pd.factorize(labels)                                  # first-appearance order (documented)
    members = [np.flatnonzero(codes == c) for c in range(len(uniq))]
    W = resample_weights(200, 300, seed=8, clusters=labels)
    for b, draw in enumerate(resample_indices(len(uniq), 300, seed=8)):
        units = np.concatenate([members[c] for c in draw])              # the explicit resampled data set
        assert np.array_equal(W[b], np.bincount(units, minlength=200))


def test_same_seed_same_replicates_and_clusters_matter():
    x = mean_stats(np.random.default_rng(9).normal(size=240))
    a = bootstrap(x, reps=400, seed=5, clusters=np.arange(240) // 4)
    b = bootstrap(x, reps=400, seed=5, clusters=np.arange(240) // 4)
    c = bootstrap(x, reps=400, seed=5, clusters=np.arange(240) % 60)   # same number of clusters, other members
    assert np.array_equal(a.replicates, b.replicates)
    assert sha256_frame(a.to_frame()) == sha256_frame(b.to_frame())
    assert not np.array_equal(a.replicates, c.replicates)
    assert not np.array_equal(a.replicates, bootstrap(x, reps=400, seed=6, clusters=np.arange(240) // 4).replicates)


def test_chunking_does_not_change_results():
    S = micro_stats(*np.random.default_rng(10).integers(0, 4, (3, 500)))
    full = replicate_sums(S, reps=700, seed=1)
    assert np.array_equal(full, replicate_sums(S, reps=700, seed=1, chunk=13))
    assert np.array_equal(full, resample_weights(500, 700, seed=1) @ S)


# ---------------------------------------------------------------- intervals against scipy
def test_percentile_and_bca_intervals_match_scipy_within_monte_carlo_error():
    x = np.random.default_rng(12).exponential(1.0, 150)
    ours = bootstrap(mean_stats(x), reps=20000, seed=1)
    for method in ("percentile", "BCa"):
        ref = sps.bootstrap((x,), np.mean, n_resamples=20000, method=method, rng=2).confidence_interval
        ci = _bounds(ours.conf_int(method.lower()))
        np.testing.assert_allclose(ci, [ref.low, ref.high], atol=0.05 * ours.se * 3)


def test_percentile_coverage_simulation():
    # 400 data sets of 60 normal values; the 95% percentile interval should cover the true mean 92-98% of the time
    g = np.random.default_rng(2026)
    hits = 0
    for k in range(400):
        x = g.normal(1.0, 2.0, 60)
        res = bootstrap(mean_stats(x), reps=1000, seed=k)
        hits += res.ci_low <= 1.0 <= res.ci_high
    assert 0.92 <= hits / 400 <= 0.98, hits / 400


# ---------------------------------------------------------------- multiple testing, kappa, ICC, W, AC1
def test_holm_equals_statsmodels():
    p = np.random.default_rng(13).random(9) ** 3
    assert np.array_equal(holm(p), multipletests(p, method="holm")[1])


def test_holm_family_adjusts_over_all_metrics():
    g = np.random.default_rng(14)
    sys_ = {s: mean_stats(g.normal(mu, 1, 200)) for s, mu in zip("ABCD", (0.3, 0.0, 0.1, 0.25))}
    fam = bootstrap_metrics({"m1": (sys_, "mean"), "m2": (sys_, "mean"), "m3": (sys_, "mean")},
                            reps=500, seed=2026, baseline="A")
    t = holm_family(fam)
    assert len(t) == 9
    assert np.array_equal(t.p_holm.to_numpy(), multipletests(t.p.to_numpy(), method="holm")[1])


@pytest.mark.parametrize("q", [2, 3, 4])
def test_kappa_and_weighted_kappa_equal_statsmodels(q):
    g = np.random.default_rng(q)
    a = g.integers(0, q, 150)
    b = np.where(g.random(150) < 0.6, a, g.integers(0, q, 150))
    T = agreement_stats(a, b, range(q)).sum(0)
    table = agreement_table(a, b, range(q)).to_numpy()
    assert np.isclose(cohen_kappa(T), cohens_kappa(table).kappa, rtol=0, atol=1e-12)
    assert np.isclose(quadratic_kappa(T), cohens_kappa(table, wt="quadratic").kappa, rtol=0, atol=1e-12)


def test_ac1_hand_computed_three_categories():
    # 20 items, categories 0/1/2. Cross-table (rows rater a, columns rater b):
    #   [[6, 1, 0], [1, 7, 1], [0, 1, 3]] -> p_o = 16/20 = 0.8
    # margins a: 7, 9, 4; b: 7, 9, 4 -> pi = 0.35, 0.45, 0.20
    # p_e = (0.35*0.65 + 0.45*0.55 + 0.20*0.80) / (3 - 1) = (0.2275 + 0.2475 + 0.16) / 2 = 0.3175
    # AC1 = (0.8 - 0.3175) / (1 - 0.3175) = 0.4825 / 0.6825 = 0.706959...
    cells = [[6, 1, 0], [1, 7, 1], [0, 1, 3]]
    a = [i for i in range(3) for j in range(3) for _ in range(cells[i][j])]
    b = [j for i in range(3) for j in range(3) for _ in range(cells[i][j])]
    T = agreement_stats(a, b).sum(0)
    assert np.isclose(percent_agreement(T), 0.8)
    assert np.isclose(gwet_ac1(T), 0.4825 / 0.6825)
    assert np.isclose(within_one(T), 1.0)


def test_icc21_equals_pingouin_icc_a1():
    pg = pytest.importorskip("pingouin")
    g = np.random.default_rng(15)
    for n, k in [(6, 4), (30, 2), (70, 3)]:
        Y = g.poisson(3, (n, 1)) + g.poisson(1, (n, k)) + np.arange(k) * 0.5
        long = pd.DataFrame([(i, j, Y[i, j]) for i in range(n) for j in range(k)], columns=["t", "r", "s"])
        ref = pg.intraclass_corr(long, targets="t", raters="r", ratings="s").set_index("Type").loc["ICC(A,1)"]
        ours = icc2_1(Y)
        assert np.isclose(ours.estimate, ref["ICC"], atol=1e-10)
        assert np.isclose(ours.extra["F"], ref["F"], atol=1e-8) and np.isclose(ours.p, ref["pval"], rtol=1e-6,
                                                                               atol=1e-12)
        # pingouin rounds to 2 decimals
        np.testing.assert_allclose([ours.ci_low, ours.ci_high], ref["CI95"], atol=0.005 + 1e-9)


def test_kendalls_w_textbook_and_friedman():
    # ProofWiki, "Kendall's Coefficient of Concordance/Examples/Arbitrary Example 1": 4 judges rank 3 competitors,
    # rank sums 7, 9, 8 (mean 8) -> S = 2 -> W = 12*2 / (4^2 * 3 * (3^2 - 1)) = 1/16
    judges = np.array([[1, 3, 2], [1, 2, 3], [2, 3, 1], [3, 1, 2]])
    assert np.isclose(kendalls_w(judges).estimate, 1 / 16)
    g = np.random.default_rng(16)
    for _ in range(20):
        X = g.integers(0, 4, (5, 7)).astype(float)                        # many ties
        w, f = kendalls_w(X), sps.friedmanchisquare(*X.T)
        assert np.isclose(w.extra["chi2"], f.statistic) and np.isclose(w.p, f.pvalue)


def test_exact_binomial_ci_matches_beta_quantiles():
    for k, n in [(0, 5), (3, 10), (41, 70), (70, 70)]:
        e = exact_binomial_ci(k, n)
        lo = 0.0 if k == 0 else sps.beta.ppf(0.025, k, n - k + 1)
        hi = 1.0 if k == n else sps.beta.ppf(0.975, k + 1, n - k)
        np.testing.assert_allclose([e.ci_low, e.ci_high], [lo, hi], atol=1e-9)


def test_rater_agreement_table_shapes_and_intervals():
    g = np.random.default_rng(17)
    a = g.integers(0, 2, 200); b = np.where(g.random(200) < 0.8, a, 1 - a)
    t = rater_agreement(a, b, seed=1, clusters=np.arange(200) // 2)
    assert list(t.columns) == ["metric", "estimate", "ci_low", "ci_high", "n", "method", "n_valid_reps"]
    assert (t.ci_low <= t.estimate).all() and (t.estimate <= t.ci_high).all()


# ---------------------------------------------------------------- distinct items, ranks, reversals
def test_distinct_counts_equal_naive_sets():
    g = np.random.default_rng(18)
    texts = [" ".join(g.choice(list("abcdef"), g.integers(2, 6))) for _ in range(150)]
    grams = [list(zip(t.split(), t.split()[1:])) for t in texts]
    X, _ = incidence(grams)
    clusters = np.arange(150) // 5
    members = [np.arange(c * 5, c * 5 + 5) for c in range(30)]
    naive = [len({bg for c in d for i in members[c] for bg in grams[i]}) for d in resample_indices(30, 300, seed=3)]
    assert np.array_equal(distinct_replicates(X, 300, seed=3, clusters=clusters), naive)
    r = bootstrap_distinct(X, totals=[len(x) for x in grams], reps=300, seed=3, clusters=clusters, scheme="recount")
    tot = np.array([len(x) for x in grams])
    assert np.allclose(r.replicates, np.array(naive) / (resample_weights(150, 300, seed=3, clusters=clusters) @ tot))


def test_ranks_and_reversals():
    g = np.random.default_rng(19)
    z = g.normal(0, 1, (4, 300)); z -= z.mean(1, keepdims=True)       # exact means 0.6, 0.4, 0.1, 0.0
    sy = {s: mean_stats(z[i] + mu) for i, (s, mu) in enumerate(zip("ABCD", (0.6, 0.4, 0.1, 0.0)))}
    res = paired_bootstrap(sy, reps=800, seed=0)
    ranks = replicate_ranks(res)
    assert ranks.shape == (800, 4) and (np.sort(ranks, 1) == np.arange(1, 5)).mean() > 0.99
    rc = rank_ci(res)
    assert rc.estimate.tolist() == [1, 2, 3,
                                    4] and (rc.ci_low <= rc.estimate).all() and (rc.estimate <= rc.ci_high).all()
    same = count_reversals(res, {"same": res})
    assert same.loc[0, ["flips", "significant_flips", "verdict_changes"]].tolist() == [0, 0, 0]
    rev = paired_bootstrap({s: mean_stats(-v[:, 0]) for s, v in sy.items()}, reps=800, seed=0)
    counts = count_reversals(res, {"reversed": rev}).iloc[0]
    assert counts.flips == 6 and counts.significant_flips == counts.verdict_changes


@pytest.mark.parametrize("K,N,a", [(3000, 400, 1.1), (300, 400, 1.0), (20000, 1000, 1.3)])
def test_distinct_ratio_coverage_shares_vs_recount(K, N, a):
    # Reports drawn from a Zipf-like generator over K templates; the estimand is the expected unique-report ratio
    # at sample size N. The per-unit share decomposition gives usable intervals; recounting distinct items in each
    # resample is biased downward (repeated units add to the denominator only) and its intervals miss the truth.
    g = np.random.default_rng(K)
    p = 1 / np.arange(1, K + 1) ** a; p /= p.sum()
    draws = np.sort(g.choice(K, (4000, N), p=p), axis=1)  # 4000 samples of N, the same draws as 4000 calls of size N
    truth = np.mean((1 + np.count_nonzero(np.diff(draws, axis=1), axis=1)) / N)    # distinct values per sample / N
    shares = recount = 0
    for k in range(200):
        X, _ = incidence([[v] for v in g.choice(K, N, p=p)])
        sh = bootstrap_distinct(X, reps=1000, seed=k)
        shares += sh.ci_low <= truth <= sh.ci_high
        rc = bootstrap_distinct(X, reps=1000, seed=k, scheme="recount")
        recount += rc.ci_low <= truth <= rc.ci_high
    assert 0.90 <= shares / 200 <= 0.995, shares / 200
    assert recount / 200 <= 0.05, recount / 200


def test_distinct_stats_sum_to_distinct_counts():
    g = np.random.default_rng(20)
    items = [list(g.choice(50, g.integers(1, 8))) for _ in range(300)]
    X, vocab = incidence(items)
    S = distinct_stats(X, totals=[len(x) for x in items])
    assert np.isclose(S[:, 0].sum(), len(vocab), rtol=0, atol=1e-9)
    r = bootstrap_distinct(X, totals=[len(x) for x in items], reps=100, seed=0)
    assert np.isclose(r.estimate, len(vocab) / sum(map(len, items)))


# ---------------------------------------------------------------- input defects (issue 16, item 8)
def _ordinal_pair(n=60, seed=30):
    g = np.random.default_rng(seed)
    a = g.integers(0, 4, n)
    return a, np.clip(a + g.integers(-1, 2, n), 0, 3)


@pytest.mark.parametrize("missing", [None, np.nan, pd.NA, float("nan")])
def test_missing_rater_label_is_an_error_naming_the_row(missing):
    a, b = _ordinal_pair()
    a = a.astype(object); a[17] = missing
    with pytest.raises(InputError, match="row 17: rater a's label is missing"):
        rater_agreement(a, b, kind="ordinal")
    with pytest.raises(InputError, match="row 17"):
        agreement_table(b, a)


def test_after_dropping_the_missing_row_weighted_kappa_matches_sklearn_and_statsmodels():
    skm = pytest.importorskip("sklearn.metrics")
    a, b = _ordinal_pair()
    keep = np.arange(len(a)) != 17                           # the row a rater left unrated, dropped by the caller
    T = agreement_stats(a[keep], b[keep], range(4)).sum(0)
    ref = skm.cohen_kappa_score(a[keep], b[keep], weights="quadratic", labels=[0, 1, 2, 3])
    assert abs(quadratic_kappa(T) - ref) < 1e-13
    assert abs(quadratic_kappa(T) - cohens_kappa(agreement_table(a[keep], b[keep], range(4)).to_numpy(),
                                                 wt="quadratic").kappa) < 1e-13
    assert abs(cohen_kappa(T) - skm.cohen_kappa_score(a[keep], b[keep])) < 1e-13
    t = rater_agreement(a[keep], b[keep], kind="ordinal", categories=[0, 1, 2, 3], reps=200).set_index("metric")
    assert t.loc["quadratic_kappa", "n"] == keep.sum() and abs(t.loc["quadratic_kappa", "estimate"] - ref) < 1e-13


def test_categories_follow_sorted_values_not_first_appearance():
    skm = pytest.importorskip("sklearn.metrics")
    a, b = ["moderate", "mild", "severe", "mild"], ["mild", "mild", "severe", "moderate"]
    assert agreement_table(a, b).index.tolist() == ["mild", "moderate", "severe"]
    levels = ["mild", "moderate", "severe"]                  # the clinical order, given explicitly
    T = agreement_stats(a, b, categories=levels).sum(0)
    ref = skm.cohen_kappa_score(a, b, weights="quadratic", labels=levels)
    assert abs(quadratic_kappa(T) - ref) < 1e-13
    assert agreement_table([12, 3, 100], [3, 3, 12]).index.tolist() == [3, 12, 100]
    with pytest.raises(InputError, match="labels of different types"):
        agreement_stats([1, "2"], [1, 1])


def test_empty_input_is_an_error_not_zero():
    for f in (lambda: agreement_stats([], []), lambda: agreement_table([], []), lambda: rater_agreement([], []),
              lambda: percent_agreement(np.zeros(0)), lambda: spearman([], []), lambda: kendall_tau([], [])):
        with pytest.raises(InputError):
            f()
    assert np.isnan(cohen_kappa(np.zeros(9)))                # a table with no items has no kappa


@pytest.mark.parametrize("k", [2.7, 0.5, np.nan, True, "3"])
def test_non_integer_counts_are_refused(k):
    with pytest.raises(InputError, match="whole number"):
        exact_binomial_ci(k, 10)
    with pytest.raises(InputError, match="row 0"):
        binomial_cis(pd.DataFrame({"k": [k], "n": [10]}), "k", "n")


def test_exact_binomial_ci_matches_statsmodels_clopper_pearson():
    for k, n, size in [(2, 10, 0.95), (0, 7, 0.9), (33, 33, 0.8), (41, 70, 0.99)]:
        np.testing.assert_allclose(_bounds(exact_binomial_ci(k, n, size).conf_int()),
                                   proportion_confint(k, n, alpha=1 - size, method="beta"), atol=1e-12)
    assert exact_binomial_ci(3.0, 10.0).estimate == 0.3


@pytest.mark.parametrize("size", [0, 0.0, 1, 1.0, 95, -0.1])
def test_size_outside_0_1_is_refused_everywhere(size):
    x = mean_stats(np.random.default_rng(31).normal(size=40))
    res = bootstrap(x, reps=50, seed=0)
    sy = {s: mean_stats(np.random.default_rng(i).normal(size=40)) for i, s in enumerate("AB")}
    pr = paired_bootstrap(sy, reps=50, seed=0)
    a, b = _ordinal_pair()
    calls = [lambda: res.conf_int(size=size), lambda: res.to_frame(size=size), lambda: bootstrap(x, reps=10, size=size),
             lambda: pr.to_frame(size=size), lambda: pr.systems_frame(size=size), lambda: pr.note(size=size),
             lambda: holm_family({"m": pr}, size=size), lambda: rank_ci(pr, size=size),
             lambda: exact_binomial_ci(3, 10, size=size), lambda: rater_agreement(a, b, size=size, reps=20),
             lambda: icc2_1(np.column_stack([a, b]), size=size), lambda: spearman(a, b, size=size)]
    for f in calls:
        with pytest.raises(InputError, match="size must be between 0 and 1"):
            f()


@pytest.mark.parametrize("clusters", [None, ["p1"] * 5])
def test_one_resampling_unit_gives_nan_interval_with_a_clear_warning(clusters):
    x = mean_stats([0.2, 0.4, 0.9, 0.1, 0.3][:1 if clusters is None else 5])
    res = bootstrap(x, reps=200, seed=0, clusters=clusters)
    for method in ("percentile", "bca"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ci = res.conf_int(method)
        assert np.isnan(_bounds(ci)).all()
        assert [x.category for x in w] == [DegenerateIntervalWarning]      # no RuntimeWarning leaks
        assert "at least 2 resampling units" in str(w[0].message)


def test_nan_replicates_are_counted_on_every_result():
    tp, fp, fn = np.zeros(30), np.r_[1.0, np.zeros(29)], np.ones(30)
    res = bootstrap(micro_stats(tp, fp, fn), micro_precision, reps=400, seed=3)
    W = resample_weights(30, 400, seed=3)
    assert res.n_valid_reps == int(((W @ (tp + fp)) > 0).sum()) < 400    # resamples that predicted something
    assert res.to_frame().n_valid_reps[0] == res.n_valid_reps
    assert [res.ci_low, res.ci_high] == [0.0, 0.0] and "resamples gave no value" in res._repr_markdown_()
    other = micro_stats(np.ones(30), np.ones(30), np.zeros(30))
    pr = paired_bootstrap({"a": micro_stats(tp, fp, fn), "b": other}, micro_precision, reps=400, seed=3)
    assert pr.to_frame().n_valid_reps.tolist() == [res.n_valid_reps]
    assert pr.systems_frame().n_valid_reps.tolist() == [res.n_valid_reps, 400]


def test_default_seed_is_core_default():
    x = mean_stats(np.random.default_rng(32).normal(size=50))
    assert np.array_equal(bootstrap(x, reps=100).replicates, bootstrap(x, reps=100, seed=DEFAULT_SEED).replicates)
    assert np.array_equal(resample_indices(7, 3), resample_indices(7, 3, seed=DEFAULT_SEED))


# --- comparison_family: paper 004's primary family (9 tests, shared clustered resamples, Holm, adjusted intervals) ---

def _family_inputs(seed=0, n_patients=80):
    "Four configurations on 3 reports per patient; validity, prefix hit and micro-F1 counts with known structure."
    g = np.random.default_rng(seed); n = 3 * n_patients
    patients = np.repeat(np.arange(n_patients), 3)
    tp = {c: g.binomial(4, q, n) for c, q in zip(("ON+B4", "OFF+B4", "ON+G1", "ON+K50"), (0.6, 0.6, 0.3, 0.62))}
    f1 = {c: micro_stats(t, g.binomial(2, 0.3, n), 4 - t) for c, t in tp.items()}
    f1["OFF+B4"] = f1["ON+B4"].copy()                                    # identical to ON+B4: effect exactly 0
    valid = {c: proportion_stats(np.ones(n)) for c in f1}                 # all valid: no difference at all
    valid["ON+K50"] = proportion_stats(g.random(n) > 0.05)               # K50 loses about 5%
    prefix = {"ON+B4": proportion_stats(np.zeros(n)), "OFF+B4": proportion_stats(np.ones(n)),   # every resample decides
              "ON+G1": proportion_stats(g.random(n) < 0.6), "ON+K50": proportion_stats(g.random(n) < 0.4)}
    metrics = {"surface_valid": (valid, "proportion"), "prefix_hit": (prefix, "proportion"),
               "micro_f1": (f1, "micro_f1")}
    return metrics, patients

PAIRS = [("ON+B4", "OFF+B4"), ("ON+B4", "ON+G1"), ("ON+B4", "ON+K50")]

def test_family_of_nine_has_the_known_structure():
    metrics, patients = _family_inputs()
    fam = comparison_family(metrics, PAIRS, reps=2000, seed=2026, clusters=patients, p_convention="floored")
    assert isinstance(fam, ComparisonFamily)
    t = fam.to_frame().set_index(["metric", "second"])
    assert len(t) == 9 and (t.reps == 2000).all()
    # identical statistics: effect 0 in every resample, p = 1, the interval is the point 0
    for key in [("micro_f1", "OFF+B4"), ("surface_valid", "OFF+B4"), ("surface_valid", "ON+G1")]:
        assert t.loc[key, "estimate"] == 0 and t.loc[key, "p"] == 1 and not t.loc[key, "significant"]
        assert t.loc[key, "ci_low_holm"] == 0 == t.loc[key, "ci_high_holm"]
    # every resample decides: p at the floor 1/B; the prefix effect is -1 exactly
    assert t.loc[("prefix_hit", "OFF+B4"), "estimate"] == -1 and t.loc[("prefix_hit", "OFF+B4"), "p"] == 1 / 2000
    # large effects are significant, in the right direction
    assert t.loc[("prefix_hit", "ON+G1"), "significant"] and t.loc[("prefix_hit", "ON+G1"), "ci_high_holm"] < 0
    assert t.loc[("micro_f1", "ON+G1"), "significant"] and t.loc[("micro_f1", "ON+G1"), "ci_low_holm"] > 0
    # Holm over the whole family of 9, not within each metric
    np.testing.assert_array_equal(t.p_holm.to_numpy(), holm(t.p.to_numpy()))
    within = np.concatenate([holm(t.loc[m].p.to_numpy()) for m in ("surface_valid", "prefix_hit", "micro_f1")])
    assert not np.array_equal(within, t.p_holm.to_numpy())

def test_family_recomputes_micro_f1_from_resampled_counts():
    metrics, patients = _family_inputs(seed=1, n_patients=30)
    with pytest.warns(UserWarning, match="no Holm-adjusted p"):   # 50 resamples cannot reach 0.05 over 9 tests
        fam = comparison_family(metrics, PAIRS, reps=50, seed=7, clusters=patients)
    W = resample_weights(len(patients), reps=50, seed=7, clusters=patients)
    f1 = metrics["micro_f1"][0]
    naive = {c: [2 * (w @ s)[0] / (2 * (w @ s)[0] + (w @ s)[1] + (w @ s)[2]) for w in W] for c, s in f1.items()}
    r = fam.compare("micro_f1")
    for i, c in enumerate(r.systems): np.testing.assert_allclose(r.replicates[i], naive[c], rtol=1e-12)
    # and every metric uses the same resamples: the validity replicates are the same weights times the 0/1 column
    v = fam.compare("surface_valid"); k = v.systems.index("ON+K50")
    np.testing.assert_allclose(v.replicates[k], W @ metrics["surface_valid"][0]["ON+K50"][:, 0] / len(patients),
                               rtol=1e-12)

@pytest.mark.parametrize("convention", ["add_one", "floored"])
@pytest.mark.parametrize("seed", range(6))
def test_holm_adjusted_intervals_are_wider_and_agree_with_p_holm(convention, seed):
    metrics, patients = _family_inputs(seed=seed, n_patients=25 + 10 * seed)
    g = np.random.default_rng(100 + seed); n = len(patients); cfg = ("ON+B4", "OFF+B4", "ON+G1", "ON+K50")
    for name, qs in (("surface_valid", (0.8, 0.74, 0.86, 0.7)), ("prefix_hit", (0.3, 0.36, 0.24, 0.4))):  # p near alpha
        metrics[name] = ({c: proportion_stats(g.random(n) < q) for c, q in zip(cfg, qs)}, "proportion")
    sparse_ = np.zeros(n); sparse_[[0, 4]] = 1  # two reports of two patients: some nan replicates
    metrics["micro_f1"][0]["ON+K50"] = micro_stats(sparse_, sparse_[::-1], np.zeros(n))
    fam = comparison_family(metrics, PAIRS, reps=400 + 300 * seed, seed=seed, clusters=patients,
                            p_convention=convention, size=(0.95, 0.9, 0.8)[seed % 3])
    t = fam.to_frame(); ok = t.p.notna()
    assert (t.ci_low_holm[ok] <= t.ci_low[ok]).all() and (t.ci_high_holm[ok] >= t.ci_high[ok]).all()
    excl = (t.ci_low_holm > 0) | (t.ci_high_holm < 0)
    assert (t.significant == excl).all()                                  # exact, for both conventions
    assert ((t.p < fam.alpha) == ((t.ci_low > 0) | (t.ci_high < 0)))[ok].all()   # unadjusted: p < alpha <=> excludes 0
    m = int(ok.sum()); steps = t.holm_step[ok].astype(int)
    rejected = t.significant[ok]
    np.testing.assert_allclose(t.holm_level[ok][rejected], 1 - fam.alpha / (m - steps[rejected] + 1))
    if (~rejected).any():                                                   # frozen at the first step not rejected
        s = steps[~rejected].min()
        np.testing.assert_allclose(t.holm_level[ok][~rejected], 1 - fam.alpha / (m - s + 1))

def test_holm_adjusted_interval_is_strictly_wider_before_the_last_step():
    metrics, patients = _family_inputs(seed=3)
    t = comparison_family(metrics, PAIRS, reps=3000, seed=1, clusters=patients).to_frame()
    varied = t[(t.holm_step < 9) & (t.ci_high > t.ci_low)]
    assert len(varied) and ((varied.ci_high_holm - varied.ci_low_holm) > (varied.ci_high - varied.ci_low)).all()

def test_p_convention_changes_the_floor_as_in_the_paper():
    # paper 004: 5,000 resamples, Holm over 9 tests; decisive comparisons print adjusted P = .002
    assert round(9 * 1 / 5000, 3) == 0.002 and round(9 * 2 / 5001, 3) == 0.004
    assert p_value_floor(5000, 9, "floored") == pytest.approx(0.0018) and p_value_floor(5000,
                                                                                        9) == pytest.approx(18 / 5001)
    n = 200; sure = {"a": proportion_stats(np.ones(n)), "b": proportion_stats(np.zeros(n))}
    fams = {c: comparison_family({f"m{i}": (sure, "proportion") for i in range(9)}, [("a", "b")], reps=5000, seed=2026,
                                 p_convention=c).to_frame() for c in ("add_one", "floored")}
    assert np.allclose(fams["floored"].p_holm, 9 / 5000) and (fams["floored"].p_holm.round(3) == 0.002).all()
    assert np.allclose(fams["add_one"].p_holm, 18 / 5001) and (fams["add_one"].p_holm.round(3) == 0.004).all()
    assert fams["floored"].significant.all() and fams["add_one"].significant.all()

def test_family_bad_input():
    metrics, patients = _family_inputs(n_patients=10)
    with pytest.raises(InputError, match="unknown system 'ON\\+X'"):
        comparison_family(metrics, [("ON+B4", "ON+X")], reps=10)
    with pytest.raises(InputError, match="p_convention must be"):
        comparison_family(metrics, PAIRS, reps=10, p_convention="paper")
    with pytest.raises(InputError, match="same units"):
        comparison_family({"v": ({"a": proportion_stats([1, 0]), "b": proportion_stats([1, 0, 1])}, "proportion")},
                          [("a", "b")], reps=10)
    with pytest.raises(InputError, match="not a column"): comparison_family(metrics, PAIRS, reps=10, clusters="patient")
    with pytest.warns(UserWarning, match="no Holm-adjusted p can be below"): comparison_family(metrics, PAIRS, reps=50)


# ---- speed-ups that must not change a bit (issue 23) -----------------------------------------------------

def _scores_table(n=300, systems=("a", "b", "c"), seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"sample_id": np.concatenate([rng.permutation(n).astype(str) for _ in systems]),
                       "system": np.repeat(list(systems), n), "metric": "m", "stat_0": rng.random(len(systems) * n),
                       "stat_1": rng.random(len(systems) * n), "cl": np.tile(np.arange(n) % 17, len(systems))})
    return df.sample(frac=1, random_state=1).reset_index(drop=True)


def test_systems_from_scores_equals_the_loc_lookup_to_the_last_bit():
    from cxr_audit.stats import systems_from_scores
    df = _scores_table()
    out, cl = systems_from_scores(df, "m", clusters="cl")
    order = pd.unique(df["sample_id"])
    for s, g in df.groupby("system", sort=False):          # the former formulation: set_index(unit).loc[order, cols]
        ref = g.set_index("sample_id").loc[order, ["stat_0", "stat_1"]].to_numpy(float)
        # same values, same column sums
        assert np.array_equal(out[s], ref) and np.array_equal(out[s].sum(0), ref.sum(0))
    units = df.drop_duplicates("sample_id").set_index("sample_id").loc[order]
    assert list(cl) == list(units["cl"])
    assert list(out) == list(pd.unique(df["system"]))  # systems in first-seen order, as groupby(sort=False) gave them
    assert systems_from_scores(df, "m")[1] is None


def test_systems_from_scores_errors_unchanged():
    from cxr_audit.stats import systems_from_scores
    df = _scores_table(n=5)
    with pytest.raises(InputError, match="has no 'm' row for unit"): systems_from_scores(df.iloc[1:], "m")
    bad = df.copy(); bad.loc[bad.index[0], "stat_0"] = np.nan
    with pytest.raises(InputError, match="missing or infinite"): systems_from_scores(bad, "m")
    text = df.astype({"stat_0": object}); text.loc[text.index[0], "stat_0"] = "x"
    with pytest.raises(InputError, match="not a numeric matrix"): systems_from_scores(text, "m")


def test_paired_to_frame_is_built_once_per_setting_and_returned_as_a_copy():
    S = {k: np.column_stack([np.random.default_rng(i).random(50), np.ones(50)]) for i, k in enumerate("ab")}
    r = bootstrap_metrics({"m": (S, "mean")}, reps=200, seed=0)["m"]
    f1 = r.to_frame(); f1["estimate"] = 99.0
    f2 = r.to_frame()
    assert f2["estimate"].iloc[0] != 99.0 and len(r._frames) == 1
    assert r.to_frame("percentile", r.size).equals(f2) and len(r._frames) == 1    # the defaults spelled out: same entry
    assert not r.to_frame(size=0.9).equals(f2) and len(r._frames) == 2
    s1 = r.systems_frame(); s1["estimate"] = 99.0
    assert r.systems_frame()["estimate"].iloc[0] != 99.0 and len(r._frames) == 3


def test_spearman_p_is_exact_for_a_handful_of_systems():
    "Two identical rankings of 5 systems: p = 2/120 (the ranking and its reverse), not the large-sample 1e-24."
    from cxr_audit.stats import spearman
    r = spearman([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    assert r.p == pytest.approx(2 / 120) and "exact permutation p" in r.method
    # ties: the permutations of the tied ranks, the same count by brute force
    import itertools
    x, y = [0.1, 0.2, 0.2, 0.5, 0.7, 0.9], [1, 3, 2, 2, 5, 4]
    rho = sps.spearmanr(x, y).statistic
    null = [abs(sps.spearmanr(x, [y[i] for i in p]).statistic) for p in itertools.permutations(range(6))]
    assert spearman(x, y).p == pytest.approx(np.mean(np.array(null) >= abs(rho) - 1e-12))


def test_systems_tied_first_share_the_first_place():
    "Two identical systems: neither is first 'with probability 1'; each counts half of every first place."
    import numpy as np
    from cxr_audit.stats import paired_bootstrap, rank_ci
    x = np.column_stack([np.random.default_rng(0).random(40), np.ones(40)])   # per unit: value, count
    r = paired_bootstrap({"a": x, "b": x.copy(), "c": x * [0.5, 1]}, reps=200, seed=0)
    t = rank_ci(r).set_index("system")
    assert t.loc["a", "p_first"] == t.loc["b", "p_first"] == 0.5 and t.loc["c", "p_first"] == 0
    assert t.p_first.sum() == 1
