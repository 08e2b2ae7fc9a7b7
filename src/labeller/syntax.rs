//! Label text rules: GFD's sanitising of product and machine names, and Kubernetes' syntax
//! for label keys and values (a key's prefix is a DNS subdomain, checked by [`dns_name`]).

use crate::dns_name;

/// GFD's `sanitise`: drops every character outside `[A-Za-z0-9-_. ]`, then joins the
/// remaining space-separated words with `-`.
///
/// `NVIDIA A100-SXM4-40GB` → `NVIDIA-A100-SXM4-40GB`; `NVIDIA-TITAN-X-(Pascal)` →
/// `NVIDIA-TITAN-X-Pascal`; `some / thing /else` → `some-thing-else`.
pub fn sanitise(text: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join("-")
}

/// Whether `value` is a valid Kubernetes label value: empty, or at most 63 characters of
/// `[A-Za-z0-9-_.]` starting and ending with a letter or digit.
pub fn is_valid_label_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    value.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `key` is a valid Kubernetes label key: an optional DNS-subdomain prefix and `/`,
/// then a name of at most 63 characters with the value rules (but not empty).
pub fn is_valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(dns_name::is_subdomain) && !name.is_empty() && is_valid_label_value(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitise_like_gfd() {
        let cases = [
            ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
            ("NVIDIA-TITAN-X-(Pascal)", "NVIDIA-TITAN-X-Pascal"),
            ("some / thing /else", "some-thing-else"),
            ("  DGX   H100 ", "DGX-H100"),
            ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
            ("Tesla T4\t(rev a1)", "Tesla-T4rev-a1"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(sanitise(input), want, "{input:?}");
        }
    }

    #[test]
    fn label_values() {
        for ok in [
            "",
            "true",
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
            "12.8",
            "a_b",
            &"x".repeat(63),
        ] {
            assert!(is_valid_label_value(ok), "{ok:?}");
        }
        for bad in ["-a", "a-", "a b", "a/b", ".x", &"x".repeat(64)] {
            assert!(!is_valid_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_keys() {
        for ok in [
            "nvidia.com/gpu.product",
            "gpud.io/gpu.health",
            "plain",
            "nvidia.com/mig-1g.10gb.count",
        ] {
            assert!(is_valid_label_key(ok), "{ok}");
        }
        for bad in [
            "",
            "nvidia.com/",
            "/x",
            "Nvidia.com/x",
            "a/b/c",
            "nvidia.com/-x",
        ] {
            assert!(!is_valid_label_key(bad), "{bad}");
        }
    }
}
