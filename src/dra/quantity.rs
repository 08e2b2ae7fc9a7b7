//! Kubernetes quantities as gpud reads them from claims: `20Gi`, `20480Mi`, `21474836480`,
//! `1.5Gi`, `20G` — binary and decimal suffixes, a decimal fraction, whole bytes.

/// A Kubernetes quantity in bytes (`20Gi`, `20480Mi`, `21474836480`, `1.5Gi`, `20G`),
/// rounded up to a whole byte; `None` when it is not one.
pub fn bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let factor: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.len() > 9 {
        return None;
    }
    let parse = |digits: &str| -> Option<u128> {
        if digits.is_empty() {
            Some(0)
        } else {
            digits.parse().ok()
        }
    };
    let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    let scaled = parse(whole)?.checked_mul(scale)? + parse(fraction)?;
    let bytes = scaled.checked_mul(factor)?.div_ceil(scale);
    u64::try_from(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(bytes("20Gi"), Some(20 * GIB));
        assert_eq!(bytes("20480Mi"), Some(20 * GIB));
        assert_eq!(bytes("21474836480"), Some(20 * GIB));
        assert_eq!(bytes("1.5Gi"), Some(3 * GIB / 2));
        assert_eq!(bytes("2G"), Some(2_000_000_000));
        assert_eq!(bytes("0.5"), Some(1));
        for bad in ["", "Gi", "20Xi", "-1Gi", "1.2.3Gi"] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
    }
}
