//! Kubernetes' DNS names (RFC 1123 as Kubernetes reads it): the one check of a DNS label and
//! a DNS subdomain for every name gpud accepts or writes — label-key prefixes, DRA driver
//! names, NVIDIA resource names. A leaf: the labeller, DRA and the NVIDIA config all use it
//! without knowing one another.
//!
//! Kubernetes' rules, byte for byte (`k8s.io/apimachinery/pkg/util/validation`):
//! - label (`IsDNS1123Label`): 1 to [`MAX_LABEL`] characters of `[a-z0-9-]`, starting and
//!   ending with a letter or digit;
//! - subdomain (`IsDNS1123Subdomain`): at most [`MAX_SUBDOMAIN`] characters, labels joined by
//!   `.`.
//!
//! Label *values* and qualified label keys have wider rules (upper case, `_`, `.`) and stay
//! with the code that writes labels.

/// The longest DNS label.
pub const MAX_LABEL: usize = 63;
/// The longest DNS subdomain.
pub const MAX_SUBDOMAIN: usize = 253;

/// Whether `name` is a DNS-1123 label: `nvidia`, `gpu-1`; not `-gpu`, `GPU`, `a.b`.
pub fn is_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= MAX_LABEL
                && is_alphanumeric(*first)
                && is_alphanumeric(*last)
                && bytes.iter().all(|&b| is_alphanumeric(b) || b == b'-')
        }
        _ => false,
    }
}

/// Whether `name` is a DNS-1123 subdomain: `nvidia.com`, `gpu.nvidia.com`, `gpu`; not
/// `gpu..com`, `.gpu`, `gpu.`, `Gpu.com`.
pub fn is_subdomain(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_SUBDOMAIN && name.split('.').all(is_label)
}

/// Lower-case letters and digits: DNS names in Kubernetes have no upper case.
fn is_alphanumeric(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let longest = "a".repeat(63);
        for ok in [
            "a",
            "0",
            "gpu",
            "gpu-1",
            "1g-10gb",
            "a--b",
            longest.as_str(),
        ] {
            assert!(is_label(ok), "{ok:?}");
        }
        let too_long = "a".repeat(64);
        for bad in [
            "",
            "-",
            "-gpu",
            "gpu-",
            "GPU",
            "gPu",
            "a.b",
            "a_b",
            "a b",
            "é",
            too_long.as_str(),
        ] {
            assert!(!is_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn subdomains() {
        let longest_label = format!("{}.com", "a".repeat(63));
        // 4 labels of 63 and their 3 dots: 255 characters; one fewer in the last: 253.
        let label = "a".repeat(63);
        let at_limit = format!("{label}.{label}.{label}.{}", "a".repeat(61));
        assert_eq!(at_limit.len(), 253);
        for ok in [
            "a",
            "gpu",
            "nvidia.com",
            "gpu.nvidia.com",
            "k8s.device-plugin.nvidia.com",
            "1.2.3",
            longest_label.as_str(),
            at_limit.as_str(),
        ] {
            assert!(is_subdomain(ok), "{ok:?}");
        }
        let label_too_long = format!("{}.com", "a".repeat(64));
        let over_limit = format!("{at_limit}a");
        for bad in [
            "",
            ".",
            ".gpu",
            "gpu.",
            "gpu..com",
            "-gpu.com",
            "gpu-.com",
            "gpu.-com",
            "GPU.nvidia.com",
            "nvidia.Com",
            "nvidia_com",
            "nvidia.com/gpu",
            label_too_long.as_str(),
            over_limit.as_str(),
        ] {
            assert!(!is_subdomain(bad), "{bad:?}");
        }
    }
}
