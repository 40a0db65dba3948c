//! Small pieces of HTML: escaping, the page layout and the formats of numbers, ages and times.
//!
//! Every piece of text that comes from the database (topics, payloads, errors) goes through
//! [`esc`] before it reaches a page; nothing here trusts it.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// HTML-escapes text for an element body or a double-quoted attribute value.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query string (`?a=1&b=2`, or empty) from pairs, with empty values left out. Escaped
/// for an attribute.
pub(super) fn query(pairs: &[(&str, &str)]) -> String {
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .copied()
        .filter(|(_, v)| !v.is_empty())
        .collect();
    if pairs.is_empty() {
        return String::new();
    }
    let q = serde_urlencoded::to_string(pairs).unwrap_or_default();
    format!("?{}", esc(&q))
}

/// A duration, roughly, in the two largest units: `42s`, `3m 12s`, `2h 5m`, `3d 4h`.
pub(super) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// A retention window in its largest whole unit: `30d`, `36h`, `90m`, `45s`.
pub(super) fn window(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A size on disk in bytes, in the largest unit that keeps it at least 1: `512 B`, `48.2 kB`,
/// `1.5 MB`, `3.1 GB` (powers of 1,000).
pub(super) fn size(bytes: i64) -> String {
    let b = bytes.max(0) as f64;
    match bytes {
        ..1_000 => format!("{} B", bytes.max(0)),
        1_000..1_000_000 => format!("{:.1} kB", b / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.1} GB", b / 1e9),
    }
}

/// A moment in UTC, with how long ago it was.
pub(super) fn when(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let stamp = t.format("%Y-%m-%d %H:%M:%S UTC");
    match (now - t).to_std() {
        Ok(d) => format!("{stamp} <span class=\"muted\">({} ago)</span>", age(d)),
        Err(_) => match (t - now).to_std() {
            Ok(d) => format!("{stamp} <span class=\"muted\">(in {})</span>", age(d)),
            Err(_) => stamp.to_string(),
        },
    }
}

/// A count with thin separators (`12,345`).
pub(super) fn num(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `1 dead letter`, `3 dead letters`.
pub(super) fn plural(n: u64, one: &str, many: &str) -> String {
    let n_text = num(i64::try_from(n).unwrap_or(i64::MAX));
    format!("{n_text} {}", if n == 1 { one } else { many })
}

/// The first `max` characters of `s`, with an ellipsis when cut.
pub(super) fn excerpt(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// Which navigation entry a page belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Nav {
    Overview,
    Dead,
    Workers,
    Events,
    None,
}

/// What every page's frame needs to know.
pub(super) struct Frame<'a> {
    /// The path the console is mounted at (`""` at the root, `/ops` when nested).
    pub(super) base: &'a str,
    /// `postgres` or `sqlite`.
    pub(super) kind: &'a str,
    pub(super) read_only: bool,
    /// Whether to show the sign-out button (the token login is in use).
    pub(super) logout: Option<&'a str>,
}

impl Frame<'_> {
    /// The overview's address.
    pub(super) fn home(&self) -> String {
        if self.base.is_empty() {
            "/".into()
        } else {
            esc(self.base)
        }
    }

    /// An address inside the console, escaped for an attribute.
    pub(super) fn link(&self, path: &str) -> String {
        esc(&format!("{}{path}", self.base))
    }

    /// A whole page.
    pub(super) fn page(&self, title: &str, nav: Nav, refresh: Option<u64>, body: &str) -> String {
        let mut h = String::with_capacity(body.len() + 2048);
        h.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
        h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
        h.push_str("<meta name=\"referrer\" content=\"same-origin\">");
        if let Some(secs) = refresh {
            let _ = write!(h, "<meta http-equiv=\"refresh\" content=\"{secs}\">");
        }
        let _ = write!(
            h,
            "<title>{} · outbox console</title>\
             <link rel=\"stylesheet\" href=\"{css}\">\
             <link rel=\"icon\" href=\"{icon}\" type=\"image/svg+xml\">\
             <script src=\"{js}\" defer></script></head><body>",
            esc(title),
            css = self.link("/assets/console.css"),
            icon = self.link("/assets/favicon.svg"),
            js = self.link("/assets/console.js"),
        );
        let item = |h: &mut String, this: Nav, href: String, label: &str| {
            let cur = if this == nav {
                " aria-current=\"page\""
            } else {
                ""
            };
            let _ = write!(h, "<a href=\"{href}\"{cur}>{label}</a>");
        };
        let _ = write!(
            h,
            "<header><a class=\"brand\" href=\"{}\"><span class=\"logo\">&#9993;</span> outbox</a><nav>",
            self.home()
        );
        item(&mut h, Nav::Overview, self.home(), "Overview");
        item(&mut h, Nav::Dead, self.link("/dead"), "Dead letters");
        item(&mut h, Nav::Workers, self.link("/workers"), "Workers");
        item(&mut h, Nav::Events, self.link("/events"), "Event log");
        h.push_str("</nav><div class=\"mode\">");
        if self.read_only {
            h.push_str("<span class=\"badge ro\" id=\"read-only\">read-only</span>");
        }
        let _ = write!(h, "<span class=\"badge\">{}</span>", esc(self.kind));
        if let Some(csrf) = self.logout {
            let _ = write!(
                h,
                "<form method=\"post\" action=\"{}\" class=\"inline\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <button class=\"link\" type=\"submit\">Sign out</button></form>",
                self.link("/logout"),
                esc(csrf)
            );
        }
        h.push_str("</div></header><main>");
        h.push_str(body);
        h.push_str("</main></body></html>\n");
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<script>alert("x&'y")</script>"#),
            "&lt;script&gt;alert(&quot;x&amp;&#39;y&quot;)&lt;/script&gt;"
        );
    }

    #[test]
    fn formats() {
        assert_eq!(num(1234567), "1,234,567");
        assert_eq!(num(-1000), "-1,000");
        assert_eq!(num(12), "12");
        assert_eq!(age(Duration::from_secs(42)), "42s");
        assert_eq!(age(Duration::from_secs(192)), "3m 12s");
        assert_eq!(age(Duration::from_secs(7500)), "2h 5m");
        assert_eq!(age(Duration::from_secs(3 * 86400 + 4 * 3600)), "3d 4h");
        assert_eq!(plural(1, "letter", "letters"), "1 letter");
        assert_eq!(plural(2000, "letter", "letters"), "2,000 letters");
        assert_eq!(window(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(window(Duration::from_secs(36 * 3600)), "36h");
        assert_eq!(window(Duration::from_secs(90 * 60)), "90m");
        assert_eq!(window(Duration::from_secs(61)), "61s");
        assert_eq!(window(Duration::from_millis(1500)), "1s");
        assert_eq!(window(Duration::ZERO), "0ms");
        assert_eq!(size(-1), "0 B");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(48_213), "48.2 kB");
        assert_eq!(size(1_500_000), "1.5 MB");
        assert_eq!(size(3_100_000_000), "3.1 GB");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(
            query(&[("topic", "a&b <c>"), ("page", "")]),
            "?topic=a%26b+%3Cc%3E"
        );
    }
}
