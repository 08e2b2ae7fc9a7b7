//! The handover's messages, and the versions of the exchange gpud speaks.
//!
//! Every message is one JSON object with a `type`. `hello` and `refused` keep their shape in
//! every version, so that any two gpud releases can at least tell each other that they cannot
//! hand over (the new one then starts cold). The other messages belong to the version the two
//! agreed on in `hello`/`offer`; a change to one of them is a new version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The versions of the exchange this gpud speaks, oldest first.
pub const VERSIONS: &[u32] = &[1];

/// One message of the exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Message {
    /// New → old: "I would take over", with the versions it speaks.
    Hello {
        versions: Vec<u32>,
        pid: u32,
        /// The new process's network namespace (inode of `/proc/self/ns/net`): TCP sockets are
        /// handed over only within one namespace (a pod of its own listens on its own address).
        netns: Option<u64>,
        /// Its host name (a pod's name in Kubernetes): the container of a pod that handed
        /// over and was restarted must not take over back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
    },
    /// Old → new: the sockets (keys, in the order of the descriptors that came with it) and
    /// the state that must survive, in the agreed `version`.
    Offer {
        version: u32,
        pid: u32,
        sockets: Vec<String>,
        state: BTreeMap<String, Value>,
        /// The old process's host name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
    },
    /// Old → new or `gpud upgrade`: no, and why. `busy`: another takeover is under way.
    Refused { reason: String, busy: bool },
    /// New → old: the new process serves now; stop.
    Stop,
    /// `gpud upgrade` → old: start the installed binary, which takes over.
    Upgrade,
    /// Old → `gpud upgrade`: the binary it started.
    Started { pid: u32, program: String },
}

/// The newest version both speak, given the other side's list.
pub fn agree(theirs: &[u32]) -> Option<u32> {
    VERSIONS.iter().rev().find(|v| theirs.contains(v)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_common_version_is_chosen_and_none_when_they_share_none() {
        assert_eq!(agree(&[1, 2, 7]), Some(1));
        assert_eq!(agree(&[2, 3]), None);
        assert_eq!(agree(&[]), None);
    }

    #[test]
    fn hello_and_refused_keep_their_wire_shape() {
        let hello = Message::Hello {
            versions: vec![1],
            pid: 7,
            netns: Some(4026531840),
            host: None,
        };
        assert_eq!(
            serde_json::to_string(&hello).unwrap(),
            r#"{"type":"hello","versions":[1],"pid":7,"netns":4026531840}"#
        );
        let refused = Message::Refused {
            reason: "busy".into(),
            busy: true,
        };
        assert_eq!(
            serde_json::to_string(&refused).unwrap(),
            r#"{"type":"refused","reason":"busy","busy":true}"#
        );
    }
}
