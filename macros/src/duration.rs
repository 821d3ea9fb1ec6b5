//! Durations written as `"250ms"`, `"2s"`, `"1m"` or `"1h"`.

use syn::LitStr;

/// The duration in `lit`, in milliseconds; a compile error on the literal when it is not one.
pub(crate) fn parse_duration(lit: &LitStr) -> syn::Result<u64> {
    let text = lit.value();
    millis(text.trim()).ok_or_else(|| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid duration `{text}`: expected a whole number and a unit (`ms`, `s`, `m` or `h`), as in \"250ms\", \"2s\", \"1m\""
            ),
        )
    })
}

/// A whole number of `ms`, `s`, `m` or `h`, nothing else.
///
/// Hand-written rather than `humantime::parse_duration`: that accepts much more (`"2 seconds"`,
/// `"1.5s"`, `"1h 30m"`, `"1M"` for a month, `"1us"`), all of which are compile errors today
/// (`tests/ui/fail/bad_duration.rs` expects `"2 seconds"` to be one). Keeping this syntax on top
/// of it would take a check as long as this function, plus a dependency to build for every
/// user of the attribute.
fn millis(text: &str) -> Option<u64> {
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    number.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use proc_macro2::Span;
    use syn::LitStr;

    use super::{millis, parse_duration};

    #[test]
    fn units_and_mistakes() {
        assert_eq!(millis("250ms"), Some(250));
        assert_eq!(millis("2s"), Some(2_000));
        assert_eq!(millis("1m"), Some(60_000));
        assert_eq!(millis("1h"), Some(3_600_000));
        assert_eq!(millis("0s"), Some(0));
        for bad in [
            "",
            "2",
            "s",
            "2 s",
            "2sec",
            "1.5s",
            "-1s",
            "99999999999999999999ms",
            "2 seconds",
            "1h 30m",
            "1h30m",
            "1M",
            "1d",
            "1us",
            "2S",
            "+2s",
            "0x10s",
            "２s",
        ] {
            assert_eq!(millis(bad), None, "{bad:?}");
        }
        assert_eq!(millis("18446744073709551615h"), None);
        assert_eq!(millis("18446744073709551615ms"), Some(u64::MAX));
        assert_eq!(millis("007s"), Some(7_000));
    }

    /// The literal is trimmed first; the error names the literal as written.
    #[test]
    fn literal_is_trimmed() {
        let lit = |text: &str| LitStr::new(text, Span::call_site());
        assert_eq!(parse_duration(&lit(" 2s ")).unwrap(), 2_000);
        let error = parse_duration(&lit("2 seconds")).unwrap_err().to_string();
        assert!(error.starts_with("invalid duration `2 seconds`: "), "{error}");
    }
}
