//! How the exporter spells XIDs. The counts themselves live in the health module's ledger
//! ([`crate::xid::ledger`]), which the health watcher writes and the renderer reads.

/// The text dcgm-exporter puts in `err_msg` for an XID: the catalog's description, or
/// `Unknown Error` for a code the catalog lacks; XID 0 is `No Error`.
pub fn message(code: u32) -> &'static str {
    if code == 0 {
        return "No Error";
    }
    crate::xid::catalog::find(code).map_or("Unknown Error", |info| info.description)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_the_catalog() {
        assert_eq!(message(79), "GPU has fallen off the bus");
        assert_eq!(message(0), "No Error");
        assert_eq!(message(9999), "Unknown Error");
    }
}
