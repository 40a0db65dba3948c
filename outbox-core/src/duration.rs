//! The one human format of every duration the outbox reads: command-line flags here, the
//! handlers' configuration files and environment variables in `outbox-handlers`.

use std::time::Duration;

/// The longest duration read: 100 years (of 365.25 days, as `100y` is read), far beyond any
/// sensible setting and well inside every timestamp type, so an absurd value is refused before
/// it reaches SQL.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(100 * 36525 * 24 * 36);

/// Reads a duration in the human format: `500ms`, `30s`, `5m`, `12h`, `7d` (units may be
/// combined: `1h30m`). A bare number counts as seconds (`2`, `0.5`), which is how the worker's
/// flags and the handlers' `timeout_secs` settings are also read. At most 100 years.
///
/// ```
/// use std::time::Duration;
///
/// assert_eq!(outbox::duration::parse("1h30m"), Ok(Duration::from_secs(5400)));
/// assert_eq!(outbox::duration::parse("0.5"), Ok(Duration::from_millis(500)));
/// assert!(outbox::duration::parse("soon").is_err());
/// ```
///
/// # Errors
///
/// A message that says what was given and how to write it.
pub fn parse(s: &str) -> Result<Duration, String> {
    let d = match s.trim().parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("`{s}` is not a duration: use 0 or more"))?,
        Err(_) => humantime::parse_duration(s.trim()).map_err(|e| {
            format!("`{s}` is not a duration ({e}); write e.g. 500ms, 30s, 5m, 12h or 7d")
        })?,
    };
    if d > MAX_DURATION {
        return Err(format!(
            "`{s}` is too long: the most is 100 years (100y, 36525d or {}s)",
            MAX_DURATION.as_secs()
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_human_format_and_bare_seconds_are_read() {
        let ms = |s: &str| parse(s).map(|d| d.as_millis());
        assert_eq!(ms("500ms"), Ok(500));
        assert_eq!(ms("5m"), Ok(300_000));
        assert_eq!(ms("1h30m"), Ok(5_400_000));
        assert_eq!(ms(" 7d "), Ok(604_800_000));
        assert_eq!(ms("2"), Ok(2_000), "a bare number is seconds");
        assert_eq!(ms("0.005"), Ok(5));
        let bad = parse("soon").unwrap_err();
        assert!(bad.contains("write e.g. 500ms"), "{bad}");
        assert!(parse("-1").is_err());
        assert!(parse("NaN").is_err());
        assert!(parse("200y").unwrap_err().contains("too long"));
    }
}
