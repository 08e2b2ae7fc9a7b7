//! Table tests of NVIDIA's config: the repository's example configs, precedence, and bad
//! configs with the exact message each one produces.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

const PATH: &str = "/config/config.yaml";

fn file(text: &str) -> Result<FileConfig, NvidiaConfigError> {
    parse(Path::new(PATH), text)
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn resolve_text(text: &str, component: Component) -> Result<Config, NvidiaConfigError> {
    let parsed = file(text)?;
    resolve(
        Some((Path::new(PATH), &parsed)),
        GivenFlags::default(),
        &env(&[]),
        component,
    )
}

#[test]
fn defaults_without_a_file() {
    let config = resolve(
        None,
        GivenFlags::default(),
        &env(&[]),
        Component::FeatureDiscovery,
    )
    .unwrap();
    let flags = &config.flags;
    assert_eq!(flags.mig_strategy, MigStrategy::None);
    assert!(flags.fail_on_init_error);
    assert_eq!(flags.nvidia_driver_root, PathBuf::from("/"));
    assert_eq!(flags.nvidia_dev_root, PathBuf::from("/"));
    assert_eq!(flags.mps_root, None);
    assert!(!flags.gdrcopy_enabled && !flags.gds_enabled && !flags.mofed_enabled);
    assert!(
        flags.use_node_feature_api,
        "GFD defaults to the NodeFeature API"
    );
    assert_eq!(
        flags.device_discovery_strategy,
        DeviceDiscoveryStrategy::Auto
    );
    assert_eq!(
        flags.plugin.device_list_strategy,
        vec![DeviceListStrategy::Envvar]
    );
    assert_eq!(flags.plugin.device_id_strategy, DeviceIdStrategy::Uuid);
    assert_eq!(flags.plugin.cdi_annotation_prefix, "cdi.k8s.io/");
    assert_eq!(
        flags.plugin.nvidia_ctk_path,
        PathBuf::from("/usr/bin/nvidia-ctk")
    );
    assert_eq!(
        flags.plugin.container_driver_root,
        PathBuf::from("/driver-root")
    );
    assert_eq!(
        flags.plugin.shared_devices_allocation_policy,
        AllocationPolicy::Distributed
    );
    assert!(!flags.gfd.oneshot && !flags.gfd.no_timestamp);
    assert_eq!(
        flags.gfd.sleep_interval,
        SleepInterval::Every(Duration::from_secs(60))
    );
    assert_eq!(
        flags.gfd.output,
        OutputTarget::File(PathBuf::from(DEFAULT_OUTPUT_FILE))
    );
    assert_eq!(
        flags.gfd.machine_type_file,
        Some(PathBuf::from(DEFAULT_MACHINE_TYPE_FILE))
    );
    assert_eq!(config.sharing.strategy(), SharingStrategy::None);
    assert!(config.warnings.is_empty());

    let dp = resolve(
        None,
        GivenFlags::default(),
        &env(&[]),
        Component::DevicePlugin,
    )
    .unwrap();
    assert!(!dp.flags.use_node_feature_api);
}

#[test]
fn nvidia_example_config0_and_config1() {
    let config0 = "version: v1\nflags:\n  migStrategy: \"none\"\n  failOnInitError: true\n  nvidiaDriverRoot: \"/\"\n  plugin:\n    passDeviceSpecs: false\n    deviceListStrategy: envvar\n    deviceIDStrategy: uuid\n";
    let config = resolve_text(config0, Component::DevicePlugin).unwrap();
    assert_eq!(config.flags.mig_strategy, MigStrategy::None);
    assert!(config.flags.fail_on_init_error);
    assert!(!config.flags.plugin.pass_device_specs);
    assert_eq!(
        config.flags.plugin.device_list_strategy,
        vec![DeviceListStrategy::Envvar]
    );
    assert_eq!(
        config.flags.plugin.device_id_strategy,
        DeviceIdStrategy::Uuid
    );

    let config1 = config0.replace("\"none\"", "\"mixed\"");
    let config = resolve_text(&config1, Component::DevicePlugin).unwrap();
    assert_eq!(config.flags.mig_strategy, MigStrategy::Mixed);
}

#[test]
fn nvidia_time_slicing_examples() {
    let plain = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n";
    let config = resolve_text(plain, Component::DevicePlugin).unwrap();
    assert_eq!(config.sharing.strategy(), SharingStrategy::TimeSlicing);
    let gpu = config.sharing.resource("nvidia.com/gpu").unwrap();
    assert_eq!(gpu.replicas, 10);
    assert_eq!(gpu.rename, None);
    assert_eq!(gpu.devices, ReplicatedDevices::All);
    assert!(!config.sharing.time_slicing.fail_requests_greater_than_one);

    let renamed = plain.replace(
        "timeSlicing:\n",
        "timeSlicing:\n    renameByDefault: true\n",
    );
    let config = resolve_text(&renamed, Component::DevicePlugin).unwrap();
    let gpu = config.sharing.resource("nvidia.com/gpu").unwrap();
    assert_eq!(gpu.rename.as_deref(), Some("nvidia.com/gpu.shared"));
}

#[test]
fn json_is_accepted() {
    let config = resolve_text(
        r#"{"version": "v1", "flags": {"migStrategy": "single", "gfd": {"sleepInterval": "30s", "outputFile": ""}}}"#,
        Component::FeatureDiscovery,
    )
    .unwrap();
    assert_eq!(config.flags.mig_strategy, MigStrategy::Single);
    assert_eq!(
        config.flags.gfd.sleep_interval,
        SleepInterval::Every(Duration::from_secs(30))
    );
    assert_eq!(config.flags.gfd.output, OutputTarget::Stdout);
}

#[test]
fn empty_version_and_empty_file_mean_v1() {
    assert!(file("version: \"\"\n").is_ok());
    assert_eq!(file("").unwrap(), FileConfig::default());
    assert_eq!(file("# only a comment\n").unwrap(), FileConfig::default());
}

#[test]
fn device_list_strategy_string_or_list() {
    let one = file("flags:\n  plugin:\n    deviceListStrategy: cdi-cri\n").unwrap();
    assert_eq!(
        one.flags.plugin.device_list_strategy,
        Some(vec![DeviceListStrategy::CdiCri])
    );
    let many =
        file("flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-annotations]\n").unwrap();
    assert_eq!(
        many.flags.plugin.device_list_strategy,
        Some(vec![
            DeviceListStrategy::Envvar,
            DeviceListStrategy::CdiAnnotations
        ])
    );
}

#[test]
fn every_key_of_flags() {
    let text = "\
flags:
  migStrategy: single
  failOnInitError: false
  nvidiaDriverRoot: /run/nvidia/driver
  nvidiaDevRoot: /
  mpsRoot: /run/nvidia/mps
  gdrcopyEnabled: true
  gdsEnabled: true
  mofedEnabled: true
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: nvml
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: volume-mounts
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
    nvidiaCTKPath: /usr/local/bin/nvidia-ctk
    containerDriverRoot: /host-driver
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: true
    noTimestamp: true
    sleepInterval: infinite
    outputFile: /tmp/gfd
    machineTypeFile: /tmp/product
imex:
  channelIDs: [0]
  required: true
";
    let config = resolve_text(text, Component::FeatureDiscovery).unwrap();
    let f = &config.flags;
    assert_eq!(f.mig_strategy, MigStrategy::Single);
    assert!(!f.fail_on_init_error);
    assert_eq!(f.nvidia_driver_root, PathBuf::from("/run/nvidia/driver"));
    assert_eq!(f.nvidia_dev_root, PathBuf::from("/"));
    assert_eq!(f.mps_root, Some(PathBuf::from("/run/nvidia/mps")));
    assert!(f.gdrcopy_enabled && f.gds_enabled && f.mofed_enabled);
    assert!(!f.use_node_feature_api);
    assert_eq!(f.device_discovery_strategy, DeviceDiscoveryStrategy::Nvml);
    assert!(f.plugin.pass_device_specs);
    assert_eq!(
        f.plugin.device_list_strategy,
        vec![DeviceListStrategy::VolumeMounts]
    );
    assert_eq!(f.plugin.device_id_strategy, DeviceIdStrategy::Index);
    assert_eq!(f.plugin.cdi_annotation_prefix, "cdi.example.com/");
    assert_eq!(
        f.plugin.nvidia_ctk_path,
        PathBuf::from("/usr/local/bin/nvidia-ctk")
    );
    assert_eq!(
        f.plugin.container_driver_root,
        PathBuf::from("/host-driver")
    );
    assert_eq!(
        f.plugin.shared_devices_allocation_policy,
        AllocationPolicy::Packed
    );
    assert!(f.gfd.oneshot && f.gfd.no_timestamp);
    assert_eq!(f.gfd.sleep_interval, SleepInterval::Infinite);
    assert_eq!(f.gfd.output, OutputTarget::File(PathBuf::from("/tmp/gfd")));
    assert_eq!(f.gfd.machine_type_file, Some(PathBuf::from("/tmp/product")));
    assert_eq!(config.imex.channel_ids, vec![0]);
    assert!(config.imex.required);
}

#[test]
fn dev_root_follows_driver_root() {
    let config = resolve_text(
        "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n",
        Component::DevicePlugin,
    )
    .unwrap();
    assert_eq!(
        config.flags.nvidia_dev_root,
        PathBuf::from("/run/nvidia/driver")
    );
}

#[test]
fn mps_fails_multi_replica_requests_by_default() {
    let mps = "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\nflags:\n  mpsRoot: /run/nvidia/mps\n";
    let config = resolve_text(mps, Component::DevicePlugin).unwrap();
    assert_eq!(config.sharing.strategy(), SharingStrategy::Mps);
    assert!(config.sharing.mps.fail_requests_greater_than_one);
    let relaxed = mps.replace(
        "  mps:\n",
        "  mps:\n    failRequestsGreaterThanOne: false\n",
    );
    let config = resolve_text(&relaxed, Component::DevicePlugin).unwrap();
    assert!(!config.sharing.mps.fail_requests_greater_than_one);
}

#[test]
fn resources_and_custom_renames_are_read_then_ignored_with_nvidia_warnings() {
    let text = "\
resources:
  gpus:
  - pattern: \"A100-SXM4-40GB\"
    name: a100
sharing:
  timeSlicing:
    resources:
    - name: gpu
      replicas: 2
      rename: my-gpu
      devices: [0, \"1\", \"0:1\", GPU-b1028956-cfa2-0990-bf4a-5da9abb51763]
";
    let config = resolve_text(text, Component::DevicePlugin).unwrap();
    assert_eq!(config.resources, Resources::default());
    let gpu = config.sharing.resource("nvidia.com/gpu").unwrap();
    assert_eq!(gpu.rename, None);
    assert_eq!(gpu.devices, ReplicatedDevices::All);
    assert_eq!(
        config.warnings,
        vec![
            RESOURCES_IGNORED.to_owned(),
            "Setting the 'rename' field in sharing.timeSlicing.resources is not yet supported in the config. Ignoring...".to_owned(),
            "Customizing the 'devices' field in sharing.timeSlicing.resources is not yet supported in the config. Ignoring...".to_owned(),
        ]
    );
    // The file model keeps what was written.
    let parsed = file(text).unwrap();
    assert_eq!(parsed.resources.gpus[0].name, "nvidia.com/a100");
}

#[test]
fn precedence_flag_over_env_over_file_over_default() {
    let parsed = file("flags:\n  migStrategy: single\n  gfd:\n    sleepInterval: 30s\n").unwrap();
    let path = Path::new(PATH);
    let resolved = |flags: &SharedFlags, gfd: &GfdFlags, vars: &[(&str, &str)]| {
        resolve(
            Some((path, &parsed)),
            GivenFlags {
                shared: Some(flags),
                plugin: None,
                gfd: Some(gfd),
            },
            &env(vars),
            Component::FeatureDiscovery,
        )
        .unwrap()
    };
    let none = SharedFlags::default();
    let no_gfd = GfdFlags::default();
    // file over default
    assert_eq!(
        resolved(&none, &no_gfd, &[]).flags.mig_strategy,
        MigStrategy::Single
    );
    // env over file; GFD_ names first
    assert_eq!(
        resolved(&none, &no_gfd, &[("MIG_STRATEGY", "mixed")])
            .flags
            .mig_strategy,
        MigStrategy::Mixed
    );
    assert_eq!(
        resolved(
            &none,
            &no_gfd,
            &[("MIG_STRATEGY", "mixed"), ("GFD_MIG_STRATEGY", "none")]
        )
        .flags
        .mig_strategy,
        MigStrategy::None
    );
    // flag over env
    let flag = SharedFlags {
        mig_strategy: Some(MigStrategy::None),
        ..SharedFlags::default()
    };
    assert_eq!(
        resolved(&flag, &no_gfd, &[("GFD_MIG_STRATEGY", "mixed")])
            .flags
            .mig_strategy,
        MigStrategy::None
    );
    // an empty variable is unset
    assert_eq!(
        resolved(&none, &no_gfd, &[("GFD_MIG_STRATEGY", "")])
            .flags
            .mig_strategy,
        MigStrategy::Single
    );
    // sleep interval through each layer
    assert_eq!(
        resolved(&none, &no_gfd, &[]).flags.gfd.sleep_interval,
        SleepInterval::Every(Duration::from_secs(30))
    );
    assert_eq!(
        resolved(&none, &no_gfd, &[("GFD_SLEEP_INTERVAL", "infinite")])
            .flags
            .gfd
            .sleep_interval,
        SleepInterval::Infinite
    );
    // GFD_OUTPUT_FILE="" means stdout, unlike other empty variables
    assert_eq!(
        resolved(&none, &no_gfd, &[("GFD_OUTPUT_FILE", "")])
            .flags
            .gfd
            .output,
        OutputTarget::Stdout
    );
    let out = GfdFlags {
        output_file: Some("-".into()),
        ..GfdFlags::default()
    };
    assert_eq!(
        resolved(&none, &out, &[]).flags.gfd.output,
        OutputTarget::Stdout
    );
}

/// The labeller tells GFD's default `useNodeFeatureAPI: true` from one that was asked for.
#[test]
fn use_node_feature_api_records_whether_it_was_given() {
    let resolved = |text: Option<&str>, flag: Option<bool>, vars: &[(&str, &str)]| {
        let parsed = text.map(|t| file(t).unwrap());
        let shared = SharedFlags {
            use_node_feature_api: flag,
            ..SharedFlags::default()
        };
        let flags = resolve(
            parsed.as_ref().map(|p| (Path::new(PATH), p)),
            GivenFlags {
                shared: Some(&shared),
                plugin: None,
                gfd: None,
            },
            &env(vars),
            Component::FeatureDiscovery,
        )
        .unwrap()
        .flags;
        (
            flags.use_node_feature_api,
            flags.use_node_feature_api_explicit,
        )
    };
    // GFD's default, and an empty variable, are not a request.
    assert_eq!(resolved(None, None, &[]), (true, false));
    assert_eq!(
        resolved(None, None, &[("GFD_USE_NODE_FEATURE_API", "")]),
        (true, false)
    );
    assert_eq!(
        resolved(Some("flags:\n  migStrategy: none\n"), None, &[]),
        (true, false)
    );
    // The file, either variable, or the flag is.
    let on = Some("flags:\n  useNodeFeatureAPI: true\n");
    let off = Some("flags:\n  useNodeFeatureAPI: false\n");
    assert_eq!(resolved(on, None, &[]), (true, true));
    assert_eq!(resolved(off, None, &[]), (false, true));
    assert_eq!(
        resolved(None, None, &[("USE_NODE_FEATURE_API", "true")]),
        (true, true)
    );
    assert_eq!(
        resolved(off, None, &[("GFD_USE_NODE_FEATURE_API", "1")]),
        (true, true)
    );
    assert_eq!(resolved(on, Some(false), &[]), (false, true));
    assert_eq!(resolved(None, Some(true), &[]), (true, true));
    // The device plugin's default is false and not given either.
    let dp = resolve(
        None,
        GivenFlags::default(),
        &env(&[]),
        Component::DevicePlugin,
    )
    .unwrap();
    assert!(!dp.flags.use_node_feature_api && !dp.flags.use_node_feature_api_explicit);
}

#[test]
fn device_plugin_ignores_gfd_env_names() {
    let config = resolve(
        None,
        GivenFlags::default(),
        &env(&[("GFD_MIG_STRATEGY", "mixed")]),
        Component::DevicePlugin,
    )
    .unwrap();
    assert_eq!(config.flags.mig_strategy, MigStrategy::None);
}

#[test]
fn config_file_lookup() {
    let vars = env(&[("CONFIG_FILE", "/b"), ("GFD_CONFIG_FILE", "/a")]);
    assert_eq!(
        config_file(None, &vars, Component::FeatureDiscovery),
        Some(PathBuf::from("/a"))
    );
    assert_eq!(
        config_file(None, &vars, Component::DevicePlugin),
        Some(PathBuf::from("/b"))
    );
    assert_eq!(
        config_file(Some(Path::new("/c")), &vars, Component::DevicePlugin),
        Some(PathBuf::from("/c"))
    );
    assert_eq!(config_file(None, &env(&[]), Component::DevicePlugin), None);
}

/// Bad configs and the exact message each produces.
#[test]
fn bad_configs_name_file_field_and_value() {
    let cases: &[(&str, &str)] = &[
        (
            "version: v2\n",
            "/config/config.yaml: field version: invalid value \"v2\": unknown version; only v1 exists",
        ),
        (
            "flags:\n  migStrategy: both\n",
            "/config/config.yaml: field flags.migStrategy: invalid value \"both\": must be one of none, single, mixed",
        ),
        (
            "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi]\n",
            "/config/config.yaml: field flags.plugin.deviceListStrategy[1]: invalid value \"cdi\": must be one of envvar, volume-mounts, cdi-annotations, cdi-cri",
        ),
        (
            "flags:\n  plugin:\n    deviceIDStrategy: serial\n",
            "/config/config.yaml: field flags.plugin.deviceIDStrategy: invalid value \"serial\": must be one of uuid, index",
        ),
        (
            "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: spread\n",
            "/config/config.yaml: field flags.plugin.sharedDevicesAllocationPolicy: invalid value \"spread\": must be one of distributed, packed",
        ),
        (
            "flags:\n  deviceDiscoveryStrategy: pci\n",
            "/config/config.yaml: field flags.deviceDiscoveryStrategy: invalid value \"pci\": must be one of auto, nvml, tegra, vfio",
        ),
        (
            "flags:\n  gfd:\n    sleepInterval: soon\n",
            "/config/config.yaml: field flags.gfd.sleepInterval: invalid value \"soon\": not a duration (examples: 60s, 1m30s, 500ms, infinite)",
        ),
        (
            "flags:\n  gfd:\n    sleepInterval: 0s\n",
            "/config/config.yaml: field flags.gfd.sleepInterval: invalid value \"0s\": must be longer than zero (or \"infinite\")",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
            "/config/config.yaml: field sharing.timeSlicing.resources[0].replicas: invalid value \"1\": must be at least 2",
        ),
        (
            "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n",
            "/config/config.yaml: field sharing.mps.resources[0].replicas: invalid value \"\": is required",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - replicas: 4\n",
            "/config/config.yaml: field sharing.timeSlicing.resources[0].name: invalid value \"\": is required",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources: []\n",
            "/config/config.yaml: field sharing.timeSlicing.resources: invalid value \"\": must list at least one resource",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: GPU\n      replicas: 2\n",
            "/config/config.yaml: field sharing.timeSlicing.resources[0].name: invalid value \"GPU\": the name after nvidia.com/ must be a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: some\n",
            "/config/config.yaml: field sharing.timeSlicing.resources[0].devices: invalid value \"some\": the only string accepted is \"all\"",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: 0\n",
            "/config/config.yaml: field sharing.timeSlicing.resources[0].devices: invalid value \"0\": a count of devices must be greater than 0",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: [\"GPU-1\"]\n",
            "/config/config.yaml: field sharing.timeSlicing.resources[0].devices[0]: invalid value \"GPU-1\": must be a GPU index (0), a MIG index (0:1) or a GPU-/MIG- UUID",
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n",
            "/config/config.yaml: field sharing: invalid value \"timeSlicing and mps\": time-slicing and MPS cannot be configured together",
        ),
        (
            "imex:\n  channelIDs: [1]\n",
            "/config/config.yaml: field imex.channelIDs: invalid value \"[1]\": only [] or [0] is supported",
        ),
        (
            "resources:\n  gpus:\n  - name: gpu\n",
            "/config/config.yaml: field resources.gpus[0].pattern: invalid value \"\": is required",
        ),
    ];
    for (text, want) in cases {
        let err = file(text).unwrap_err().to_string();
        assert_eq!(&err, want, "for {text:?}");
    }
}

#[test]
fn unknown_keys_and_wrong_types_name_the_path() {
    let err = file("flags:\n  gfd:\n    sleepIntervall: 10s\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("/config/config.yaml: flags.gfd: unknown field `sleepIntervall`"),
        "{err}"
    );
    let err =
        file("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: ten\n")
            .unwrap_err()
            .to_string();
    assert!(
        err.starts_with("/config/config.yaml: sharing.timeSlicing.resources[0].replicas: invalid type: string \"ten\""),
        "{err}"
    );
    let err = file("migStrategy: mixed\n").unwrap_err().to_string();
    assert!(
        err.starts_with("/config/config.yaml: unknown field `migStrategy`"),
        "{err}"
    );
}

#[test]
fn bad_environment_names_the_variable() {
    let err = resolve(
        None,
        GivenFlags::default(),
        &env(&[("MIG_STRATEGY", "maybe")]),
        Component::FeatureDiscovery,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "environment variable MIG_STRATEGY: field flags.migStrategy: invalid value \"maybe\": must be one of none, single, mixed"
    );
    let err = resolve(
        None,
        GivenFlags::default(),
        &env(&[("GFD_ONESHOT", "yes")]),
        Component::FeatureDiscovery,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "environment variable GFD_ONESHOT: field flags.gfd.oneshot: invalid value \"yes\": must be true or false"
    );
}

#[test]
fn device_plugin_rules_after_merging() {
    let mps_mixed = "flags:\n  migStrategy: mixed\n  mpsRoot: /run/nvidia/mps\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n";
    let err = resolve_text(mps_mixed, Component::DevicePlugin)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "/config/config.yaml: field flags.migStrategy: invalid value \"mixed\": sharing with MPS cannot be combined with the mixed MIG strategy"
    );
    // GFD reads the same file without the device plugin's rules.
    assert!(resolve_text(mps_mixed, Component::FeatureDiscovery).is_ok());

    let no_root = "sharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n";
    let err = resolve_text(no_root, Component::DevicePlugin)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "/config/config.yaml: field flags.mpsRoot: invalid value \"\": sharing with MPS needs mpsRoot (--mps-root, MPS_ROOT)"
    );
    // The flag layer can supply what the file lacks.
    let parsed = file(no_root).unwrap();
    let flags = SharedFlags {
        mps_root: Some(PathBuf::from("/run/nvidia/mps")),
        ..SharedFlags::default()
    };
    assert!(
        resolve(
            Some((Path::new(PATH), &parsed)),
            GivenFlags {
                shared: Some(&flags),
                ..GivenFlags::default()
            },
            &env(&[]),
            Component::DevicePlugin
        )
        .is_ok()
    );

    let err = resolve_text(
        "flags:\n  deviceDiscoveryStrategy: vfio\n",
        Component::DevicePlugin,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("field flags.deviceDiscoveryStrategy: invalid value \"vfio\""),
        "{err}"
    );
    assert!(
        resolve_text(
            "flags:\n  deviceDiscoveryStrategy: vfio\n",
            Component::FeatureDiscovery
        )
        .is_ok()
    );
}

#[test]
fn unreadable_file_names_the_path() {
    let err = load(Path::new("/nonexistent/gpud/config.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("/nonexistent/gpud/config.yaml: cannot read: "),
        "{err}"
    );
}
