//! Phone numbers: the E.164 checks and the normalisation every layer uses (configuration
//! validation, call admission, the API), kept here so none of them imports another for it.

/// True when `s` is an E.164 number: `+`, then 8 to 15 digits, the first not `0`.
pub(crate) fn is_e164(s: &str) -> bool {
    let Some(digits) = s.strip_prefix('+') else {
        return false;
    };
    (8..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0')
}

/// True when `s` is an E.164 prefix (for `allowed_destinations`): `+` then 1 to 15 digits.
pub(crate) fn is_e164_prefix(s: &str) -> bool {
    let Some(digits) = s.strip_prefix('+') else {
        return false;
    };
    (1..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Normalizes a number as carriers and people write it (`+1 (555) 000-1234`, `0044…`,
/// Plivo's `15550001234`) to E.164, or `None` when it cannot be one.
pub(crate) fn normalize_e164(s: &str) -> Option<String> {
    let cleaned: String = s
        .trim()
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')' | '\t'))
        .collect();
    let candidate = if let Some(rest) = cleaned.strip_prefix("00") {
        format!("+{rest}")
    } else if cleaned.starts_with('+') {
        cleaned
    } else {
        format!("+{cleaned}")
    };
    is_e164(&candidate).then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e164() {
        assert!(is_e164("+15550001234"));
        assert!(is_e164("+44207123456"));
        assert!(!is_e164("15550001234"));
        assert!(!is_e164("555-1234"));
        assert!(!is_e164("+0555000123"));
        assert!(!is_e164("+1234567"));
        assert!(!is_e164("+1234567890123456"));
        assert!(!is_e164("+1555000123a"));
        assert!(is_e164_prefix("+1"));
        assert!(is_e164_prefix("+1555"));
        assert!(!is_e164_prefix("+"));
        assert!(!is_e164_prefix("1555"));
    }

    #[test]
    fn normalizes() {
        assert_eq!(
            normalize_e164("+1 (555) 000-1234").as_deref(),
            Some("+15550001234")
        );
        assert_eq!(
            normalize_e164("15550001234").as_deref(),
            Some("+15550001234")
        );
        assert_eq!(
            normalize_e164("0044207123456").as_deref(),
            Some("+44207123456")
        );
        assert_eq!(normalize_e164("555-1234"), None);
        assert_eq!(normalize_e164("anonymous"), None);
    }
}
