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
    use super::millis;

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
        ] {
            assert_eq!(millis(bad), None, "{bad:?}");
        }
        assert_eq!(millis("18446744073709551615h"), None);
    }
}
