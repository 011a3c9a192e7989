//! Run ids from wall-clock time (UTC), without a date library.

/// A run id `YYYYMMDD-HHMMSS-<label>` for a run started at `unix_ms`
/// milliseconds since the Unix epoch, in UTC, e.g. `20261122-021500-demo`.
/// Characters of `label` that do not belong in a folder name become `-`.
pub fn make_run_id(unix_ms: u64, label: &str) -> String {
    let secs = unix_ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let label: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}-{label}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// `unix_ms` as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn format_utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The time of day of `unix_ms` to the millisecond, `HH:MM:SS.mmm UTC`.
pub fn format_utc_time_ms(unix_ms: u64) -> String {
    let rem = unix_ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_utc_dates() {
        assert_eq!(make_run_id(0, "demo"), "19700101-000000-demo");
        // 2026-11-22T02:15:00Z
        assert_eq!(
            make_run_id(1_795_313_700_000, "demo"),
            "20261122-021500-demo"
        );
        // Leap day and a year end.
        assert_eq!(make_run_id(951_782_400_000, "x"), "20000229-000000-x");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(
            format_utc_time_ms(951_782_400_000 + 45_296_789),
            "12:34:56.789 UTC"
        );
        assert_eq!(
            make_run_id(1_704_067_199_999, "chaos kill/fabric"),
            "20231231-235959-chaos-kill-fabric"
        );
    }
}
