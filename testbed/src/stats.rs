//! Order statistics of measured figures: the one median and the one
//! nearest-rank quantile every report of the testbed uses, so that two
//! reports never disagree on what "the median of the rounds" means.

/// The `q` quantile of `values` by nearest rank (`q` clamped to 0..=1);
/// NaN when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let sorted = sorted(values);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

/// The median of `values`: the middle one, or the mean of the middle two
/// when their number is even; NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    median_of_sorted(&sorted(values))
}

/// The median, smallest and largest of `values` (all NaN when empty).
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    let sorted = sorted(values);
    (
        median_of_sorted(&sorted),
        sorted.first().copied().unwrap_or(f64::NAN),
        sorted.last().copied().unwrap_or(f64::NAN),
    )
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

fn median_of_sorted(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
        assert_eq!(quantile(&[5.0], 0.0), 5.0);
        assert_eq!(quantile(&[5.0, 1.0], 7.0), 5.0);
    }

    #[test]
    fn the_median_averages_the_middle_two_of_an_even_count() {
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        assert_eq!(median(&[4.0, 1.0, 2.0]), 2.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn a_spread_is_median_min_and_max() {
        assert_eq!(spread(&[3.0, 9.0, 1.0]), (3.0, 1.0, 9.0));
        let (m, lo, hi) = spread(&[]);
        assert!(m.is_nan() && lo.is_nan() && hi.is_nan());
    }
}
