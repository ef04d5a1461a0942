//! Small measuring tools shared by the benchmarks: process CPU time, percentiles, the spread of
//! repeated runs, and byte sizes on the command line.

use std::time::Duration;

/// CPU time (user + system) this process has used so far, every thread included.
#[must_use]
pub fn process_cpu_time() -> Duration {
    // SAFETY: rusage is plain old data; all-zero is a valid value for getrusage to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_SELF needs nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let micros = |t: libc::timeval| {
        let secs = u64::try_from(t.tv_sec).unwrap_or(0);
        let us = u64::try_from(t.tv_usec).unwrap_or(0);
        Duration::from_secs(secs) + Duration::from_micros(us)
    };
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

pub use crate::probe::percentile_us;

/// Median and range of one figure over repeated runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Median (the mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; all zero if there are none.
    #[must_use]
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Spread::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median, min: v[0], max: v[n - 1] }
    }
}

/// Parse a byte size: digits with an optional K, M, G or T suffix (binary), optionally
/// followed by "iB" or "B".
///
/// # Errors
/// Text that is not such a size, zero, or a size that overflows.
pub fn parse_size(text: &str) -> Result<u64, String> {
    parse_size_like(text, "4G")
}

/// [`parse_size`], naming `example` in the message for text that is not a size.
///
/// # Errors
/// Text that is not such a size, zero, or a size that overflows.
pub fn parse_size_like(text: &str, example: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let unit_start = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(unit_start);
    let number: u64 =
        digits.parse().map_err(|_| format!("{text:?} is not a size like {example}"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("unknown unit {unit:?} in {text:?} (use K, M, G or T)")),
    };
    number
        .checked_mul(1u64 << shift)
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("size {text:?} is zero or too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_percentiles() {
        let s = Spread::of([3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of([1.0, 2.0, 4.0, 8.0]).median, 3.0);
        assert_eq!(Spread::of([]), Spread::default());
        let ns: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile_us(&ns, 0.5), 50.0);
        assert_eq!(percentile_us(&ns, 0.99), 99.0);
        assert_eq!(percentile_us(&[], 0.5), 0.0);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
    }

    #[test]
    fn cpu_time_moves() {
        let before = process_cpu_time();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(process_cpu_time() >= before);
    }
}
