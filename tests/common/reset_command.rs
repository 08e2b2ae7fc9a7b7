//! The remediation tests' reset command — a script that logs each call and resets the
//! simulated GPUs it names through the node's control file — and their look at the
//! remediation record gpud keeps in the node's state folder.

use std::path::PathBuf;

use serde_json::Value;

use super::{Node, until};

/// Writes `<node>/reset.sh` and returns its path: it logs its arguments to
/// `<node>/resets.log`, runs `before` (a hang, a failure), then resets the GPUs named by
/// `-i <bus id>[,<bus id>…]` through the control file.
pub fn write(node: &Node, before: &str) -> PathBuf {
    let dir = node.dir.path();
    let script = format!(
        "#!/bin/sh\necho \"$@\" >> {log}\n{before}\nfor id in $(echo \"$2\" | tr , ' '); do echo \"reset $id\" >> {control}; done\n",
        log = dir.join("resets.log").display(),
        control = node.control_path().display(),
    );
    let path = dir.join("reset.sh");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The reset command's calls so far, one line of arguments each.
pub fn calls(node: &Node) -> Vec<String> {
    std::fs::read_to_string(node.dir.path().join("resets.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// GPU `uuid`'s remediation record once `accept` holds for it, within `secs`; when it does
/// not, the failure shows the record and `log` (gpud's log).
pub fn record_when(
    node: &Node,
    uuid: &str,
    what: &str,
    secs: u64,
    log: impl Fn() -> String,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    let path = node.dir.path().join("state/remediation.json");
    until(what, secs, || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let record: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let gpu = &record["gpus"][uuid];
        if accept(gpu) {
            Ok(gpu.clone())
        } else {
            Err(format!("{text}\n--- gpud's log:\n{}", log()))
        }
    })
}
