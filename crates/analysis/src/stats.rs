//! Descriptive statistics and the two tests the regression gate and the paper tables need:
//! the exact McNemar test on paired successes and a paired bootstrap confidence interval.
//! Pure: no IO, and every random draw comes from a seeded, version-stable generator.

use reprobench_domain::synthetic::SplitMix64;

/// Arithmetic mean; NaN for an empty slice.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Sample standard deviation (n − 1 denominator); None for fewer than two values.
pub fn sample_std(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let m = mean(values);
    let ss: f64 = values.iter().map(|v| (v - m) * (v - m)).sum();
    Some((ss / (values.len() - 1) as f64).sqrt())
}

/// The `p`-th percentile (`p` in 0..=100) by linear interpolation between the closest ranks:
/// the value at rank `p / 100 · (n − 1)` of the sorted values, interpolated between its two
/// neighbours. This is numpy's default (`method="linear"`), so tables match the papers' scripts.
/// NaN for an empty slice; NaN values sort last.
///
/// # Panics
/// If `p` is outside 0..=100 (a caller's bug: pass a percentage, not a fraction).
pub fn percentile(values: &[f64], p: f64) -> f64 {
    assert!(
        (0.0..=100.0).contains(&p),
        "percentile {p} is outside 0..=100; pass a percentage, e.g. 95 rather than 0.95"
    );
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    // Skip the interpolation on exact ranks so that an infinite neighbour cannot produce NaN.
    if frac == 0.0 {
        sorted[lo]
    } else {
        sorted[lo] + (sorted[hi] - sorted[lo]) * frac
    }
}

/// Relative improvement of `reference` over `other` in percent, `(reference − other) / other ·
/// 100`, as the LTGDroid and ReProAgent papers print it (e.g. 60 vs 40 → 50 %). Infinite or
/// NaN when `other` is 0.
pub fn relative_improvement_pct(reference: f64, other: f64) -> f64 {
    (reference - other) / other * 100.0
}

/// Two-sided exact McNemar test on the discordant counts `b` and `c` (tasks that flipped one way
/// and the other): under the null hypothesis each flip goes either way with probability 1/2, so
/// `p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)])`; 1 when there is no flip.
///
/// Computed in log space (binomial terms are summed relative to the largest one), so it neither
/// overflows nor loses precision for `b + c` in the hundreds of thousands; a p-value below the
/// smallest positive f64 comes out as 0.
pub fn mcnemar_exact_p(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // ln of the largest term in the tail, C(n, k) / 2^n: the terms grow with i up to n / 2 ≥ k.
    let ln_last = (1..=k)
        .map(|i| ((n - k + i) as f64 / i as f64).ln())
        .sum::<f64>()
        - n as f64 * std::f64::consts::LN_2;
    // Sum the tail downwards relative to that term: term(i − 1) / term(i) = i / (n − i + 1).
    let mut sum = 1.0;
    let mut term = 1.0;
    for i in (1..=k).rev() {
        term *= i as f64 / (n - i + 1) as f64;
        sum += term;
        // Later terms only shrink faster, so the rest cannot reach the last bits of the sum.
        if term < sum * 1e-18 {
            break;
        }
    }
    (2.0 * (ln_last + sum.ln()).exp()).min(1.0)
}

/// Paired bootstrap confidence interval of the difference in success rate, new − old, in
/// percentage points. `pairs` holds one `(old_success, new_success)` per task; `resamples`
/// times the tasks are drawn with replacement (as pairs, so the pairing is kept) from a
/// SplitMix64 seeded with `seed`, and the interval is the percentile interval at confidence
/// `level` (e.g. 0.95) of the resampled differences. (NaN, NaN) for no pairs or no resamples.
///
/// # Panics
/// If `level` is not strictly between 0 and 1 (a caller's bug: pass 0.95, not 95).
pub fn bootstrap_diff_ci(
    pairs: &[(bool, bool)],
    resamples: usize,
    seed: u64,
    level: f64,
) -> (f64, f64) {
    assert!(
        level > 0.0 && level < 1.0,
        "confidence level {level} is not between 0 and 1; pass e.g. 0.95 rather than 95"
    );
    if pairs.is_empty() || resamples == 0 {
        return (f64::NAN, f64::NAN);
    }
    let diffs: Vec<i64> = pairs
        .iter()
        .map(|&(old, new)| i64::from(new) - i64::from(old))
        .collect();
    let n = diffs.len();
    let mut rng = SplitMix64::new(seed);
    let samples: Vec<f64> = (0..resamples)
        .map(|_| {
            let total: i64 = (0..n)
                .map(|_| {
                    // Multiply-high maps 64 random bits onto 0..n without the bias of `%`.
                    let i = ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize;
                    diffs[i]
                })
                .sum();
            100.0 * total as f64 / n as f64
        })
        .collect();
    let tail = (1.0 - level) / 2.0 * 100.0;
    (
        percentile(&samples, tail),
        percentile(&samples, 100.0 - tail),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative closeness, for values computed independently (Python, exact fractions).
    fn close(actual: f64, expected: f64, rel: f64) -> bool {
        actual == expected || (actual - expected).abs() <= rel * expected.abs()
    }

    #[test]
    fn mean_and_std() {
        // (values, mean, std) from Python's statistics.fmean / statistics.stdev.
        let cases: &[(&[f64], f64, Option<f64>)] = &[
            (
                &[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0],
                5.0,
                Some(2.138089935299395),
            ),
            (&[1.5, 2.5], 2.0, Some(std::f64::consts::FRAC_1_SQRT_2)), // √0.5
            (&[1.0, 2.0, 3.0, 4.0, 10.0], 4.0, Some(3.5355339059327378)),
            (&[3.0], 3.0, None),
        ];
        for (values, m, s) in cases {
            assert_eq!(mean(values), *m, "mean of {values:?}");
            match (sample_std(values), s) {
                (Some(a), Some(e)) => assert!(close(a, *e, 1e-12), "std of {values:?}: {a} vs {e}"),
                (a, e) => assert_eq!(a, *e, "std of {values:?}"),
            }
        }
        assert!(mean(&[]).is_nan());
        assert_eq!(sample_std(&[]), None);
    }

    #[test]
    fn percentile_interpolates_linearly_between_ranks() {
        // Expected values worked by hand with rank = p / 100 · (n − 1), numpy's default.
        let v = [10.0, 1.0, 4.0, 2.0, 3.0];
        let cases = [
            (0.0, 1.0),
            (25.0, 2.0),
            (50.0, 3.0),
            (90.0, 7.6), // rank 3.6: 4 + 0.6 · (10 − 4)
            (100.0, 10.0),
        ];
        for (p, expected) in cases {
            let got = percentile(&v, p);
            assert!(close(got, expected, 1e-12), "p{p}: {got} vs {expected}");
        }
        assert_eq!(percentile(&[1.0, 2.0], 50.0), 1.5);
        assert!(close(percentile(&[1.0, 2.0], 10.0), 1.1, 1e-12));
        assert_eq!(percentile(&[2.0], 37.0), 2.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    #[should_panic(expected = "pass a percentage")]
    fn percentile_rejects_fractions_above_100() {
        percentile(&[1.0], 250.0);
    }

    #[test]
    fn relative_improvement_follows_the_papers() {
        assert_eq!(relative_improvement_pct(60.0, 40.0), 50.0);
        assert_eq!(relative_improvement_pct(30.0, 40.0), -25.0);
        assert!(relative_improvement_pct(1.0, 0.0).is_infinite());
    }

    #[test]
    fn mcnemar_matches_exact_binomial_tails() {
        // ((b, c), p) from Python: min(1, Fraction(2 · Σ_{i ≤ min(b,c)} math.comb(n, i), 2**n)).
        let cases = [
            ((10, 2), 0.03857421875),
            ((2, 10), 0.03857421875),
            ((0, 0), 1.0),
            ((5, 5), 1.0),
            ((1, 0), 1.0),
            ((7, 3), 0.34375),
            ((0, 20), 1.9073486328125e-06),
            ((400, 300), 0.00017847631448562445),
            ((1000, 900), 0.02310884510890107),
            ((3000, 2000), 1.3002310005203771e-45),
            ((50000, 50000), 1.0),
            ((50500, 49500), 0.0015823598788515956),
            ((51000, 49000), 2.588716038346898e-10),
            ((0, 100000), 0.0), // 2^-99999 is below the smallest f64
        ];
        for ((b, c), expected) in cases {
            let got = mcnemar_exact_p(b, c);
            assert!(
                close(got, expected, 1e-9),
                "McNemar({b}, {c}) = {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn bootstrap_ci_covers_the_true_difference_and_is_reproducible() {
        // 200 tasks: 30 fixed, 10 broken, the rest unchanged: true new − old = +10 pp.
        let mut pairs = vec![(false, true); 30];
        pairs.extend(vec![(true, false); 10]);
        pairs.extend(vec![(true, true); 80]);
        pairs.extend(vec![(false, false); 80]);
        let (lo, hi) = bootstrap_diff_ci(&pairs, 2000, 7, 0.95);
        assert!(lo < 10.0 && 10.0 < hi, "[{lo}, {hi}]");
        // The normal approximation gives 10 ± 6.0 pp (1.96 · √(0.19 / 200)); the bootstrap must agree.
        assert!(lo > 3.0 && hi < 17.0, "[{lo}, {hi}]");
        assert_eq!(bootstrap_diff_ci(&pairs, 2000, 7, 0.95), (lo, hi));
        assert_ne!(bootstrap_diff_ci(&pairs, 2000, 8, 0.95), (lo, hi));
        // A wider level gives a wider interval from the same draws.
        let (lo99, hi99) = bootstrap_diff_ci(&pairs, 2000, 7, 0.99);
        assert!(lo99 <= lo && hi <= hi99);
        // No flips: every resample has difference 0.
        assert_eq!(
            bootstrap_diff_ci(&[(true, true), (false, false)], 100, 1, 0.95),
            (0.0, 0.0)
        );
        let (a, b) = bootstrap_diff_ci(&[], 100, 1, 0.95);
        assert!(a.is_nan() && b.is_nan());
    }
}
