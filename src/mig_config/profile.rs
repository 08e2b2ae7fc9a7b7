//! MIG profile names as configs write them: `[<C>c.]<G>g.<GB>gb[+me|+me.all|+gfx][-me]`,
//! e.g. `1g.10gb`, `1g.10gb+me`, `1c.3g.40gb`.

use std::fmt;

/// A parsed profile name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProfileName {
    /// Compute slices of the compute instance; `None` means the whole GPU instance.
    pub compute: Option<u32>,
    /// Compute slices of the GPU instance.
    pub gpu: u32,
    /// Nominal memory in GB.
    pub gb: u32,
    /// Attribute suffix as written (`+me`, `+me.all`, `+gfx`, `-me`, or empty).
    pub attributes: String,
}

/// Attribute suffixes before an optional `-me`.
const ATTRIBUTES: [&str; 4] = ["", "+me", "+me.all", "+gfx"];

impl ProfileName {
    /// Parses a name, explaining what is wrong with a bad one.
    pub fn parse(text: &str) -> Result<ProfileName, String> {
        let bad = || {
            format!(
                "{text:?} is not a MIG profile name like \"1g.10gb\", \"1g.10gb+me\" or \
                 \"1c.3g.40gb\""
            )
        };
        let number = |s: &str| -> Option<u32> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
                .filter(|&n| n > 0)
        };
        let gb_end = text.find("gb").ok_or_else(bad)?;
        let (head, attributes) = (&text[..gb_end], &text[gb_end + 2..]);
        if !ATTRIBUTES.contains(&attributes.strip_suffix("-me").unwrap_or(attributes)) {
            return Err(bad());
        }
        let parts: Vec<&str> = head.split('.').collect();
        let (compute, gpu, gb) = match parts.as_slice() {
            [g, gb] => (None, *g, *gb),
            [c, g, gb] => (
                Some(c.strip_suffix('c').and_then(number).ok_or_else(bad)?),
                *g,
                *gb,
            ),
            _ => return Err(bad()),
        };
        let gpu = gpu.strip_suffix('g').and_then(number).ok_or_else(bad)?;
        let gb = number(gb).ok_or_else(bad)?;
        if compute.is_some_and(|c| c > gpu) {
            return Err(format!(
                "{text:?}: a compute instance cannot have more slices than its GPU instance"
            ));
        }
        Ok(ProfileName {
            compute: compute.filter(|&c| c != gpu),
            gpu,
            gb,
            attributes: attributes.to_owned(),
        })
    }

    /// The GPU-instance part, e.g. `3g.40gb` for `1c.3g.40gb`.
    pub fn gpu_instance(&self) -> String {
        format!("{}g.{}gb{}", self.gpu, self.gb, self.attributes)
    }

    /// Compute slices of the compute instance.
    pub fn compute_slices(&self) -> u32 {
        self.compute.unwrap_or(self.gpu)
    }
}

impl fmt::Display for ProfileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = self.compute {
            write!(f, "{c}c.")?;
        }
        f.write_str(&self.gpu_instance())
    }
}

/// The name of a `compute`-slice compute instance inside a GPU instance called `gi_name`.
pub fn device_name(gi_name: &str, gi_slices: u32, compute: u32) -> String {
    if compute == gi_slices {
        gi_name.to_owned()
    } else {
        format!("{compute}c.{gi_name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in [
            "1g.10gb",
            "1g.10gb+me",
            "1c.3g.40gb",
            "7g.141gb",
            "1g.10gb+me.all",
            "2g.20gb-me",
        ] {
            assert_eq!(ProfileName::parse(name).unwrap().to_string(), name);
        }
        let p = ProfileName::parse("2c.4g.40gb+me").unwrap();
        assert_eq!((p.compute, p.gpu, p.gb), (Some(2), 4, 40));
        assert_eq!(p.gpu_instance(), "4g.40gb+me");
        // A compute part as large as the GPU instance is the plain name.
        assert_eq!(
            ProfileName::parse("3c.3g.40gb").unwrap().to_string(),
            "3g.40gb"
        );
    }

    #[test]
    fn bad_names() {
        for name in [
            "",
            "1g",
            "g.10gb",
            "1g.10",
            "1x.10gb",
            "1g.10gb+foo",
            "0g.10gb",
            "4c.3g.40gb",
            "1c.1c.3g.40gb",
        ] {
            assert!(ProfileName::parse(name).is_err(), "{name}");
        }
    }

    #[test]
    fn device_names() {
        assert_eq!(device_name("3g.40gb", 3, 3), "3g.40gb");
        assert_eq!(device_name("3g.40gb", 3, 1), "1c.3g.40gb");
    }
}
