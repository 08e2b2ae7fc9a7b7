//! `gpud mig` end to end on the simulated driver: every default config applies and asserts,
//! export → apply round-trips, exact plans (mode change, repartition, infeasible), idempotent
//! apply, hooks and their environment, and convergence after a crash or an NVML failure at
//! each kind of step; and NVIDIA's Python bindings see the instances export prints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/pynvml.rs"]
mod pynvml;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{Node, stdout_ok};

fn default_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/mig/config-default.yaml")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn mig(node: &Node, args: &[&str]) -> Output {
    let mut full = vec!["mig"];
    full.extend_from_slice(args);
    node.run(&full)
}

fn write(node: &Node, name: &str, text: &str) -> String {
    let path = node.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn export(node: &Node) -> String {
    stdout_ok(&mig(node, &["export"]))
}

/// The labels of the default config whose entries match every MIG-capable GPU of `fixture`
/// (the others leave some GPU unmatched, which assert reports by design).
fn applicable_labels(node: &Node) -> Vec<String> {
    let text = std::fs::read_to_string(default_config()).unwrap();
    let spec: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let labels: Vec<String> = spec["mig-configs"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    let cfg = default_config();
    labels
        .into_iter()
        .filter(|label| {
            // `plan` matches entries without touching anything; an unmatched capable GPU
            // shows as "not matched".
            let out = mig(node, &["plan", "-f", cfg.to_str().unwrap(), "-c", label]);
            out.status.success() && !stdout_ok(&out).contains("not matched by the config")
        })
        .collect()
}

#[test]
fn every_default_config_applies_and_asserts() {
    let cfg = default_config();
    let cfg = cfg.to_str().unwrap();
    for (fixture, expected_labels) in [
        ("a100-mig", 10),
        ("h100-mig", 10),
        ("mixed", 10),
        ("dgx-a100", 10),
    ] {
        let node = Node::new(fixture);
        let labels = applicable_labels(&node);
        assert_eq!(labels.len(), expected_labels, "{fixture}: {labels:?}");
        for label in &labels {
            let out = mig(&node, &["apply", "-f", cfg, "-c", label]);
            assert!(out.status.success(), "{fixture} {label}: {}", stderr(&out));
            assert!(stderr(&out).ends_with("MIG configuration applied successfully\n"));
            let out = mig(&node, &["assert", "-f", cfg, "-c", label]);
            assert!(out.status.success(), "{fixture} {label}: {}", stderr(&out));
            // Applying again changes nothing: no step is logged.
            let again = mig(&node, &["apply", "-f", cfg, "-c", label]);
            assert_eq!(
                stderr(&again),
                "MIG configuration applied successfully\n",
                "{fixture} {label}"
            );
        }
    }
}

#[test]
fn export_round_trips_through_apply() {
    let node = Node::new("a100-mig");
    let exported = export(&node);
    assert_eq!(
        exported,
        "version: v1\nmig-configs:\n  current:\n  - device-filter:\n    - '0x20B210DE'\n    \
         devices: all\n    mig-enabled: true\n    mig-devices:\n      1g.10gb: 1\n      \
         2g.20gb: 1\n      3g.40gb: 1\n"
    );
    let saved = write(&node, "current.yaml", &exported);
    let cfg = default_config();
    let out = mig(
        &node,
        &["apply", "-f", cfg.to_str().unwrap(), "-c", "all-1g.10gb"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(export(&node), exported);
    let out = mig(&node, &["apply", "-f", &saved]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(export(&node), exported);
    assert!(mig(&node, &["assert", "-f", &saved]).status.success());
}

const CONFIG: &str = "version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  repartition:
    - devices: all
      mig-enabled: true
      mig-devices: {\"1g.10gb\": 2, \"2g.20gb\": 1, \"1c.3g.40gb\": 3}
  infeasible:
    - devices: all
      mig-enabled: true
      mig-devices: {\"3g.40gb\": 2, \"1g.10gb\": 1}
";

#[test]
fn plan_for_a_repartition_is_exact_and_touches_nothing() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    let before = export(&node);
    let out = mig(&node, &["plan", "-f", &cfg, "-c", "repartition"]);
    assert_eq!(
        stdout_ok(&out),
        "GPU 0 GPU-92943319-76de-de32-f55a-b6a72767408c (NVIDIA A100-SXM4-80GB)\n  \
         mode: enabled (unchanged)\n  \
         keep    GI  4 2g.20gb     slices 2-3  [2g.20gb]\n  \
         keep    GI  8 1g.10gb     slices 1-1  [1g.10gb]\n  \
         destroy GI  1 3g.40gb     slices 4-7  [3g.40gb]\n  \
         create  1g.10gb        slices 0-0  [1g.10gb]\n  \
         create  3g.40gb        slices 4-7  [1c.3g.40gb, 1c.3g.40gb, 1c.3g.40gb]\n  \
         processes: none\n"
    );
    assert_eq!(export(&node), before);
    let out = mig(&node, &["apply", "-f", &cfg, "-c", "repartition"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        mig(&node, &["assert", "-f", &cfg, "-c", "repartition"])
            .status
            .success()
    );
}

#[test]
fn plan_for_a_mode_change_is_exact() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    let out = mig(&node, &["plan", "-f", &cfg, "-c", "all-disabled"]);
    assert_eq!(
        stdout_ok(&out),
        "GPU 0 GPU-92943319-76de-de32-f55a-b6a72767408c (NVIDIA A100-SXM4-80GB)\n  \
         mode: enabled -> disabled (GPU reset needed; a reboot where the GPU cannot be reset)\n  \
         destroy GI  1 3g.40gb     slices 4-7  [3g.40gb]\n  \
         destroy GI  4 2g.20gb     slices 2-3  [2g.20gb]\n  \
         destroy GI  8 1g.10gb     slices 1-1  [1g.10gb]\n  \
         processes: none\n"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout_ok(&mig(
        &node,
        &["plan", "-f", &cfg, "-c", "all-disabled", "-o", "json"],
    )))
    .unwrap();
    assert_eq!(json[0]["mode_change"], true);
    assert_eq!(json[0]["reset_needed"], true);
    assert_eq!(json[0]["create"], serde_json::json!([]));
}

#[test]
fn an_infeasible_config_is_refused_before_any_change() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    let before = export(&node);
    let want = "gpud: GPU 0 (NVIDIA A100-SXM4-80GB): 1x 1g.10gb, 2x 3g.40gb cannot be placed: \
                no arrangement of these GPU instances fits the GPU's placement table (checked \
                exhaustively); nothing was changed\n";
    let plan = mig(&node, &["plan", "-f", &cfg, "-c", "infeasible"]);
    assert_eq!(plan.status.code(), Some(1));
    assert_eq!(stderr(&plan), want);
    let apply = mig(&node, &["apply", "-f", &cfg, "-c", "infeasible"]);
    assert_eq!(apply.status.code(), Some(1));
    assert_eq!(stderr(&apply), want);
    assert_eq!(export(&node), before);
}

#[test]
fn assert_failures_and_config_errors() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    let out = mig(&node, &["assert", "-f", &cfg, "-c", "repartition"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "gpud: assertion failure: selected configuration not currently applied (GPU 0: MIG \
         devices are {1g.10gb: 1, 2g.20gb: 1, 3g.40gb: 1}, the config wants {1c.3g.40gb: 3, \
         1g.10gb: 2, 2g.20gb: 1})\n"
    );
    assert!(
        mig(
            &node,
            &["assert", "-f", &cfg, "-c", "repartition", "--mode-only"]
        )
        .status
        .success()
    );
    assert!(
        mig(&node, &["assert", "-f", &cfg, "-c", "repartition", "-a"])
            .status
            .success()
    );
    let out = mig(&node, &["assert", "-f", &cfg, "-c", "nope", "-a"]);
    assert_eq!(out.status.code(), Some(65));
    assert_eq!(
        stderr(&out),
        format!(
            "gpud: {cfg}: selected config \"nope\" not present in the file (it has: \
             all-disabled, infeasible, repartition)\n"
        )
    );
    let out = mig(&node, &["assert", "-f", &cfg]);
    assert_eq!(out.status.code(), Some(65));
    let bad = write(
        &node,
        "bad.yaml",
        "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, typo: 1}]}\n",
    );
    let out = mig(&node, &["assert", "-f", &bad, "-a"]);
    assert_eq!(out.status.code(), Some(65));
    assert!(
        stderr(&out).contains("unknown field `typo`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn environment_selects_like_mig_parted() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    let out = node
        .gpud(&["mig", "apply"])
        .env("MIG_PARTED_CONFIG_FILE", &cfg)
        .env("MIG_PARTED_SELECTED_CONFIG", "all-disabled")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(export(&node).contains("mig-enabled: false"));
}

#[test]
fn hooks_run_in_order_with_the_flag_environment() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    let log = node.dir.path().join("hooks.log");
    let hook = |point: &str| {
        format!(
            "  {point}:\n    - command: /bin/sh\n      args: [\"-c\", \"echo {point} $MIG_PARTED_SELECTED_CONFIG $MIG_PARTED_SKIP_RESET $EXTRA ${{HOME:-nohome}} >> {}\"]\n      envs: {{EXTRA: x}}\n",
            log.display()
        )
    };
    let hooks = write(
        &node,
        "hooks.yaml",
        &format!(
            "version: v1\nhooks:\n{}{}{}{}",
            hook("apply-start"),
            hook("pre-apply-mode"),
            hook("pre-apply-config"),
            hook("apply-exit")
        ),
    );
    let out = mig(
        &node,
        &["apply", "-f", &cfg, "-c", "repartition", "-k", &hooks],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "apply-start repartition false x nohome\n\
         pre-apply-config repartition false x nohome\n\
         apply-exit repartition false x nohome\n"
    );
    std::fs::remove_file(&log).unwrap();
    let out = mig(
        &node,
        &["apply", "-f", &cfg, "-c", "all-disabled", "-k", &hooks],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "apply-start all-disabled false x nohome\n\
         pre-apply-mode all-disabled false x nohome\n\
         apply-exit all-disabled false x nohome\n"
    );
}

/// For each kind of MIG step: the driver fails it (exit 1, reason named), and separately the
/// process is SIGKILLed at it; after the fault is revoked the next apply converges.
#[test]
fn apply_converges_after_failures_and_kills_at_each_step() {
    let cfg_text = CONFIG;
    for op in [
        "set-mode",
        "destroy-ci",
        "destroy-gi",
        "create-gi",
        "create-ci",
    ] {
        for kill in [false, true] {
            let node = Node::new("a100-mig");
            let cfg = write(&node, "c.yaml", cfg_text);
            // set-mode is exercised by turning MIG off; the rest by a repartition.
            let label = if op == "set-mode" {
                "all-disabled"
            } else {
                "repartition"
            };
            node.inject(&format!(
                "mig-fail 0 {op}{}",
                if kill { " kill" } else { "" }
            ));
            let out = mig(&node, &["apply", "-f", &cfg, "-c", label]);
            if kill {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(out.status.signal(), Some(9), "{op}: {}", stderr(&out));
            } else {
                assert_eq!(out.status.code(), Some(1), "{op}");
                let all = stderr(&out);
                let err = all.lines().last().unwrap_or_default().to_owned() + "\n";
                assert!(err.starts_with("gpud: GPU 0: "), "{op}: {err}");
                assert!(
                    err.ends_with(" failed: an internal driver error occurred\n"),
                    "{op}: {err}"
                );
            }
            assert!(
                !mig(&node, &["assert", "-f", &cfg, "-c", label])
                    .status
                    .success()
            );
            node.inject(&format!("mig-ok 0 {op}"));
            let out = mig(&node, &["apply", "-f", &cfg, "-c", label]);
            assert!(out.status.success(), "{op} kill={kill}: {}", stderr(&out));
            assert!(
                mig(&node, &["assert", "-f", &cfg, "-c", label])
                    .status
                    .success(),
                "{op}"
            );
        }
    }
}

#[test]
fn a_busy_gpu_is_refused_with_its_pids_unless_forced() {
    let node = Node::new("a100-mig");
    let cfg = write(&node, "c.yaml", CONFIG);
    node.inject("process 0 4242");
    node.inject("process 0 17");
    let before = export(&node);
    let plan = stdout_ok(&mig(&node, &["plan", "-f", &cfg, "-c", "repartition"]));
    assert!(plan.ends_with("  processes: 17, 4242\n"), "{plan}");
    let out = mig(&node, &["apply", "-f", &cfg, "-c", "repartition"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "gpud: refusing to change GPUs in use: GPU 0 (PIDs 17, 4242); stop those processes \
         or pass --force\n"
    );
    assert_eq!(export(&node), before);
    // Applying what is already there touches nothing, so it is not refused.
    let saved = write(&node, "current.yaml", &before);
    assert!(mig(&node, &["apply", "-f", &saved]).status.success());
    let out = mig(
        &node,
        &["apply", "-f", &cfg, "-c", "repartition", "--force"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    node.inject("process-end 0 4242");
    node.inject("process-end 0 17");
    let out = mig(&node, &["apply", "-f", &cfg, "-c", "all-disabled"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `generate-config` writes the all-* configs from the GPUs' own profile tables: the file
/// validates, every config applies and asserts, and each all-<profile> config fills the GPU
/// exactly as NVIDIA's default set does.
#[test]
fn generated_configs_validate_and_apply() {
    for fixture in ["a100-mig", "h100-mig"] {
        let node = Node::new(fixture);
        let text = stdout_ok(&mig(&node, &["generate-config"]));
        let path = write(&node, "generated.yaml", &text);
        let spec: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
        let labels: Vec<String> = spec["mig-configs"]
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            labels,
            [
                "all-1g.10gb",
                "all-1g.10gb.me",
                "all-1g.20gb",
                "all-2g.20gb",
                "all-3g.40gb",
                "all-4g.40gb",
                "all-7g.80gb",
                "all-balanced",
                "all-disabled",
                "all-enabled"
            ],
            "{fixture}"
        );
        let json = stdout_ok(&mig(&node, &["generate-config", "-o", "json"]));
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            json["mig-configs"]["all-1g.10gb"][0]["mig-devices"],
            serde_json::json!({"1g.10gb": 7}),
            "{fixture}"
        );
        let defaults = std::fs::read_to_string(default_config()).unwrap();
        let defaults: serde_yaml_ng::Value = serde_yaml_ng::from_str(&defaults).unwrap();
        for label in &labels {
            let out = mig(&node, &["assert", "-a", "-f", &path, "-c", label]);
            assert!(out.status.success(), "{fixture} {label}: {}", stderr(&out));
            let out = mig(&node, &["apply", "-f", &path, "-c", label]);
            assert!(out.status.success(), "{fixture} {label}: {}", stderr(&out));
            let out = mig(&node, &["assert", "-f", &path, "-c", label]);
            assert!(out.status.success(), "{fixture} {label}: {}", stderr(&out));
            // The same layout as the default set's config of that name for this GPU model.
            let ours = &spec["mig-configs"][label.as_str()][0];
            let filter = ours["device-filter"].as_str();
            let theirs = defaults["mig-configs"][label.as_str()]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|e| {
                    filter.is_none_or(|id| {
                        e["device-filter"]
                            .as_sequence()
                            .is_some_and(|ids| ids.iter().any(|i| i.as_str() == Some(id)))
                    })
                })
                .unwrap_or_else(|| panic!("{fixture} {label}: not in the default set"));
            assert_eq!(
                ours["mig-devices"], theirs["mig-devices"],
                "{fixture} {label}"
            );
        }
    }
}

/// A mode change the driver holds for a GPU reset (`NVML_ERROR_IN_USE`): the reset command gets
/// the GPU's bus id, the apply waits for the mode and finishes; a reset that does not bring the
/// mode is reported after --reset-wait and the next apply completes the change.
#[test]
fn a_mode_change_waits_for_the_reset_command() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("a100-mig");
    let cfg = default_config();
    let cfg = cfg.to_str().unwrap();
    let called = node.dir.path().join("reset-called");
    // The reset as nvidia-smi -r -i <bus ids> would do it: the simulated driver applies the
    // pending mode on a `reset <gpu>` control line.
    let script = write(
        &node,
        "reset.sh",
        &format!(
            "#!/bin/sh\necho \"$@\" >> {}\necho \"reset 0\" >> \"$NVML_MOCK_CONTROL\"\n",
            called.display()
        ),
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let apply = |label: &str, reset: &str| {
        node.gpud(&[
            "mig",
            "apply",
            "-f",
            cfg,
            "-c",
            label,
            "--reset-command",
            reset,
            "--reset-wait",
            "2s",
        ])
        .env("NVML_MOCK_MIG_IN_USE", "1")
        .output()
        .unwrap()
    };
    // A reset that does nothing: the mode stays pending and the apply says so.
    let out = apply("all-disabled", "true");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).ends_with("gpud: GPU 0: MIG mode still pending 2s after the reset\n"),
        "{}",
        stderr(&out)
    );
    assert!(!called.exists());
    // The real reset: called once with the GPU's bus id, and the config is in effect.
    let out = apply("all-disabled", &script);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&called).unwrap(),
        "00000000:07:00.0\n"
    );
    let out = mig(&node, &["assert", "-f", cfg, "-c", "all-disabled"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // And back: enabling goes through the reset too, then the instances are created.
    let out = apply("all-1g.10gb", &script);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mig(&node, &["assert", "-f", cfg, "-c", "all-1g.10gb"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&called).unwrap().lines().count(), 2);
}

/// After an apply, NVIDIA's Python bindings reading the driver see exactly the GPU and compute
/// instances `gpud mig export` prints.
#[test]
fn nvidia_ml_py_sees_the_instances_export_prints() {
    let node = Node::new("a100-mig");
    let config = write(&node, "config.yaml", CONFIG);
    let out = mig(&node, &["apply", "-f", &config, "-c", "repartition"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exported: serde_yaml_ng::Value = serde_yaml_ng::from_str(&export(&node)).unwrap();
    let devices = &exported["mig-configs"]["current"][0]["mig-devices"];
    let mut words: Vec<String> = devices
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{}={}", k.as_str().unwrap(), v.as_u64().unwrap()))
        .collect();
    words.sort();
    assert_eq!(words.join(" "), "1c.3g.40gb=3 1g.10gb=2 2g.20gb=1");
    if let Some(seen) = pynvml::mig_devices(&node) {
        assert_eq!(seen, words.join(" "));
    }
}
