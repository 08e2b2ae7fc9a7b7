//! Group 1: library lifetime, enumeration, identity, memory, affinity, power limits,
//! topology and NVLink inventory, and the C-boundary rules (NULLs, sizes, versions, handles).

use std::os::raw::{c_char, c_int, c_uint, c_ulong};
use std::ptr::{null, null_mut};

use crate::common::*;

fn fixture_json(name: &str) -> serde_json::Value {
    let path = format!(
        "{}/../fixtures/nodes/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn calls_before_init_and_after_shutdown_are_uninitialized() {
    let _g = start(fixture("dgx-h100"));
    assert_eq!(call!(nvmlShutdown()), rc::SUCCESS);
    let mut n: c_uint = 0;
    assert_eq!(call!(nvmlDeviceGetCount_v2(&mut n)), rc::UNINITIALIZED);
    assert_eq!(call!(nvmlShutdown()), rc::UNINITIALIZED);
}

#[test]
fn init_is_reference_counted_and_handles_survive_reinit() {
    let _g = start(fixture("dgx-h100"));
    let before = gpu(3);
    assert_eq!(call!(nvmlInitWithFlags(0)), rc::SUCCESS);
    assert_eq!(call!(nvmlShutdown()), rc::SUCCESS);
    let mut n: c_uint = 0;
    assert_eq!(call!(nvmlDeviceGetCount_v2(&mut n)), rc::SUCCESS);
    assert_eq!(call!(nvmlShutdown()), rc::SUCCESS);
    testing::configure(fixture("dgx-h100"));
    assert_eq!(call!(nvmlInit_v2()), rc::SUCCESS);
    assert_eq!(gpu(3), before);
}

#[test]
fn bad_fixture_fails_init_with_unknown() {
    let _g = start(fixture("empty"));
    testing::reset();
    let dir = scratch("badfixture");
    let path = dir.join("bad.json");
    std::fs::write(&path, r#"{"driver_version": "570.1", "nvml_version": "12.570.1.0", "cuda_driver_version": 12080, "seed": 1, "gpus": [], "colour": 1}"#).unwrap();
    testing::configure(Config {
        fixture: Some(path.display().to_string()),
        ..Config::default()
    });
    assert_eq!(call!(nvmlInit_v2()), rc::UNKNOWN);
    testing::configure(Config {
        fixture: Some("no-such-fixture".into()),
        ..Config::default()
    });
    assert_eq!(call!(nvmlInit_v2()), rc::UNKNOWN);
}

#[test]
fn system_versions() {
    let _g = start(fixture("dgx-h100"));
    assert_eq!(
        string(|b, n| call!(nvmlSystemGetDriverVersion(b, n))),
        Ok("570.133.20".into())
    );
    assert_eq!(
        string(|b, n| call!(nvmlSystemGetNVMLVersion(b, n))),
        Ok("12.570.133.20".into())
    );
    let mut cuda: c_int = 0;
    assert_eq!(
        call!(nvmlSystemGetCudaDriverVersion(&mut cuda)),
        rc::SUCCESS
    );
    assert_eq!(cuda, 12080);
    assert_eq!(
        call!(nvmlSystemGetCudaDriverVersion_v2(&mut cuda)),
        rc::SUCCESS
    );
    // SAFETY: nvmlErrorString returns a pointer to a static NUL-terminated string.
    let text =
        unsafe { std::ffi::CStr::from_ptr(nvidia_ml_mock::nvmlErrorString(rc::GPU_IS_LOST)) };
    assert_eq!(text.to_str().unwrap(), "GPU is lost");
}

#[test]
fn dgx_h100_inventory_matches_the_fixture() {
    let _g = start(fixture("dgx-h100"));
    let json = fixture_json("dgx-h100");
    let mut n: c_uint = 0;
    assert_eq!(call!(nvmlDeviceGetCount_v2(&mut n)), rc::SUCCESS);
    assert_eq!(n, 8);
    for i in 0..n {
        let h = gpu(i);
        let spec = &json["gpus"][i as usize];
        assert_eq!(name(h), "NVIDIA H100 80GB HBM3");
        assert_eq!(uuid(h), spec["uuid"].as_str().unwrap());
        assert_eq!(
            string(|b, l| call!(nvmlDeviceGetSerial(h, b, l))).unwrap(),
            spec["serial"].as_str().unwrap()
        );
        let mut index: c_uint = 99;
        assert_eq!(call!(nvmlDeviceGetIndex(h, &mut index)), rc::SUCCESS);
        assert_eq!(index, i);
        let mut minor: c_uint = 99;
        assert_eq!(call!(nvmlDeviceGetMinorNumber(h, &mut minor)), rc::SUCCESS);
        assert_eq!(minor, i);
        let mut pci: nvmlPciInfo_t = unsafe_zeroed_pci();
        assert_eq!(call!(nvmlDeviceGetPciInfo_v3(h, &mut pci)), rc::SUCCESS);
        assert_eq!(c_field(&pci.busId), spec["pci_bus_id"].as_str().unwrap());
        assert_eq!(pci.pciDeviceId, 0x2330_10DE);
        let (mut major, mut minor_cc): (c_int, c_int) = (0, 0);
        assert_eq!(
            call!(nvmlDeviceGetCudaComputeCapability(
                h,
                &mut major,
                &mut minor_cc
            )),
            rc::SUCCESS
        );
        assert_eq!((major, minor_cc), (9, 0));
        let mut arch: nvmlDeviceArchitecture_t = 0;
        assert_eq!(call!(nvmlDeviceGetArchitecture(h, &mut arch)), rc::SUCCESS);
        assert_eq!(arch, NVML_DEVICE_ARCH_HOPPER);
        let mut numa: c_uint = 9;
        assert_eq!(call!(nvmlDeviceGetNumaNodeId(h, &mut numa)), rc::SUCCESS);
        assert_eq!(numa, if i < 4 { 0 } else { 1 });
        for l in 0..18 {
            let mut state: nvmlEnableState_t = 0;
            assert_eq!(
                call!(nvmlDeviceGetNvLinkState(h, l, &mut state)),
                rc::SUCCESS
            );
            assert_eq!(state, nvmlEnableState_enum_NVML_FEATURE_ENABLED);
            let mut kind: nvmlIntNvLinkDeviceType_t = 0;
            assert_eq!(
                call!(nvmlDeviceGetNvLinkRemoteDeviceType(h, l, &mut kind)),
                rc::SUCCESS
            );
            assert_eq!(
                kind,
                nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
            );
        }
        let mut state: nvmlEnableState_t = 0;
        assert_eq!(
            call!(nvmlDeviceGetNvLinkState(h, 18, &mut state)),
            rc::INVALID_ARGUMENT
        );
    }
    let mut remote: nvmlPciInfo_t = unsafe_zeroed_pci();
    assert_eq!(
        call!(nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu(0), 17, &mut remote)),
        rc::SUCCESS
    );
    assert_eq!(c_field(&remote.busId), "00000000:08:00.0");
    assert_eq!(remote.pciDeviceId, 0x22A3_10DE);
}

fn unsafe_zeroed_pci() -> nvmlPciInfo_t {
    nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: [0; 32],
    }
}

#[test]
fn lookups_by_uuid_bus_id_and_serial() {
    let _g = start(fixture("dgx-h100"));
    let json = fixture_json("dgx-h100");
    let spec = &json["gpus"][5];
    let want = gpu(5);
    let mut h: nvmlDevice_t = null_mut();
    let uuid = std::ffi::CString::new(spec["uuid"].as_str().unwrap()).unwrap();
    assert_eq!(
        call!(nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut h)),
        rc::SUCCESS
    );
    assert_eq!(h, want);
    for bus in ["00000000:AB:00.0", "0000:ab:00.0", "ab:00.0"] {
        let bus = std::ffi::CString::new(bus).unwrap();
        assert_eq!(
            call!(nvmlDeviceGetHandleByPciBusId_v2(bus.as_ptr(), &mut h)),
            rc::SUCCESS
        );
        assert_eq!(h, want);
    }
    let serial = std::ffi::CString::new(spec["serial"].as_str().unwrap()).unwrap();
    assert_eq!(
        call!(nvmlDeviceGetHandleBySerial(serial.as_ptr(), &mut h)),
        rc::SUCCESS
    );
    assert_eq!(h, want);
    let missing = std::ffi::CString::new("GPU-00000000-0000-0000-0000-000000000000").unwrap();
    assert_eq!(
        call!(nvmlDeviceGetHandleByUUID(missing.as_ptr(), &mut h)),
        rc::NOT_FOUND
    );
    let junk = std::ffi::CString::new("zz:zz").unwrap();
    assert_eq!(
        call!(nvmlDeviceGetHandleByPciBusId_v2(junk.as_ptr(), &mut h)),
        rc::INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvmlDeviceGetHandleByIndex_v2(8, &mut h)),
        rc::INVALID_ARGUMENT
    );
}

#[test]
fn boundary_rules() {
    let _g = start(fixture("dgx-h100"));
    let h = gpu(0);
    // NULL out-pointers.
    assert_eq!(
        call!(nvmlDeviceGetCount_v2(null_mut())),
        rc::INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvmlDeviceGetHandleByIndex_v2(0, null_mut())),
        rc::INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvmlDeviceGetHandleByUUID(null(), &mut null_mut())),
        rc::INVALID_ARGUMENT
    );
    // Unknown and wrong-kind handles.
    let bogus = 0x1000 as nvmlDevice_t;
    let mut n: c_uint = 0;
    assert_eq!(
        call!(nvmlDeviceGetIndex(bogus, &mut n)),
        rc::INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvmlDeviceGetIndex(null_mut(), &mut n)),
        rc::INVALID_ARGUMENT
    );
    let mut set: nvmlEventSet_t = null_mut();
    assert_eq!(call!(nvmlEventSetCreate(&mut set)), rc::SUCCESS);
    assert_eq!(
        call!(nvmlDeviceGetIndex(set.cast(), &mut n)),
        rc::INVALID_ARGUMENT
    );
    // Strings: exact fit needs room for the NUL.
    let name = "NVIDIA H100 80GB HBM3";
    let mut buf = [0 as c_char; 32];
    assert_eq!(
        call!(nvmlDeviceGetName(h, buf.as_mut_ptr(), name.len() as c_uint)),
        rc::INSUFFICIENT_SIZE
    );
    assert_eq!(
        call!(nvmlDeviceGetName(
            h,
            buf.as_mut_ptr(),
            name.len() as c_uint + 1
        )),
        rc::SUCCESS
    );
    assert_eq!(c_field(&buf), name);
    // Versioned structs.
    let mut mem = nvmlMemory_v2_t {
        version: 1,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(
        call!(nvmlDeviceGetMemoryInfo_v2(h, &mut mem)),
        rc::ARGUMENT_VERSION_MISMATCH
    );
}

#[test]
fn memory_v1_and_v2_agree() {
    let _g = start(fixture("dgx-h100"));
    let h = gpu(2);
    let mut v1 = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(call!(nvmlDeviceGetMemoryInfo(h, &mut v1)), rc::SUCCESS);
    let mut v2 = nvmlMemory_v2_t {
        version: 0x0200_0028,
        total: 0,
        reserved: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(call!(nvmlDeviceGetMemoryInfo_v2(h, &mut v2)), rc::SUCCESS);
    assert_eq!(v1.total, 81559 << 20);
    assert_eq!(v2.total, v1.total);
    assert_eq!(v2.reserved, 325 << 20);
    assert_eq!(v2.free + v2.reserved + v2.used, v2.total);
    assert_eq!(v1.used, v2.used + v2.reserved);
    assert_eq!(v1.free, v2.free);
}

#[test]
fn affinity_and_power_limits() {
    let _g = start(fixture("dgx-h100"));
    let h = gpu(5);
    let mut cpus = [0 as c_ulong; 4];
    assert_eq!(
        call!(nvmlDeviceGetCpuAffinity(h, 4, cpus.as_mut_ptr())),
        rc::SUCCESS
    );
    // CPUs 56-111 and 168-223.
    assert_eq!(cpus[0], !0 << 56);
    assert_eq!(cpus[1], (1 << 48) - 1);
    assert_eq!(cpus[2], !0 << 40);
    assert_eq!(cpus[3], (1 << 32) - 1);
    let mut nodes = [0 as c_ulong; 1];
    assert_eq!(
        call!(nvmlDeviceGetMemoryAffinity(
            h,
            1,
            nodes.as_mut_ptr(),
            NVML_AFFINITY_SCOPE_NODE
        )),
        rc::SUCCESS
    );
    assert_eq!(nodes[0], 0b10);
    let (mut limit, mut default, mut enforced, mut min, mut max) = (0, 0, 0, 0, 0);
    assert_eq!(
        call!(nvmlDeviceGetPowerManagementLimit(h, &mut limit)),
        rc::SUCCESS
    );
    assert_eq!(
        call!(nvmlDeviceGetPowerManagementDefaultLimit(h, &mut default)),
        rc::SUCCESS
    );
    assert_eq!(
        call!(nvmlDeviceGetEnforcedPowerLimit(h, &mut enforced)),
        rc::SUCCESS
    );
    assert_eq!(
        call!(nvmlDeviceGetPowerManagementLimitConstraints(
            h, &mut min, &mut max
        )),
        rc::SUCCESS
    );
    assert_eq!(
        (limit, default, enforced, min, max),
        (700_000, 700_000, 700_000, 200_000, 700_000)
    );
    let mut mode: nvmlEnableState_t = 0;
    assert_eq!(
        call!(nvmlDeviceGetPersistenceMode(h, &mut mode)),
        rc::SUCCESS
    );
    assert_eq!(mode, nvmlEnableState_enum_NVML_FEATURE_ENABLED);
    let mut brand: nvmlBrandType_t = 0;
    assert_eq!(call!(nvmlDeviceGetBrand(h, &mut brand)), rc::SUCCESS);
    assert_eq!(brand, nvmlBrandType_enum_NVML_BRAND_NVIDIA);
}

fn level(a: u32, b: u32) -> nvmlGpuTopologyLevel_t {
    let mut l: nvmlGpuTopologyLevel_t = 99;
    assert_eq!(
        call!(nvmlDeviceGetTopologyCommonAncestor(gpu(a), gpu(b), &mut l)),
        rc::SUCCESS
    );
    l
}

fn p2p(a: u32, b: u32, caps: nvmlGpuP2PCapsIndex_t) -> nvmlGpuP2PStatus_t {
    let mut s: nvmlGpuP2PStatus_t = 99;
    assert_eq!(
        call!(nvmlDeviceGetP2PStatus(gpu(a), gpu(b), caps, &mut s)),
        rc::SUCCESS
    );
    s
}

#[test]
fn topology_of_the_builtin_fixtures() {
    let nvl = nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK;
    let ok = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK;
    let not = nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED;
    {
        let _g = start(fixture("dgx-h100"));
        assert_eq!(level(0, 1), nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE);
        assert_eq!(level(1, 6), nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM);
        assert_eq!(p2p(0, 7, nvl), ok);
    }
    {
        let _g = start(fixture("pcie-4gpu"));
        assert_eq!(level(0, 1), nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE);
        assert_eq!(level(2, 3), nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE);
        assert_eq!(level(0, 3), nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM);
        assert_eq!(p2p(0, 1, nvl), ok);
        assert_eq!(p2p(1, 2, nvl), not);
        let mut remote = nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pciDeviceId: 0,
            pciSubSystemId: 0,
            busId: [0; 32],
        };
        assert_eq!(
            call!(nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu(2), 11, &mut remote)),
            rc::SUCCESS
        );
        assert_eq!(c_field(&remote.busId), "00000000:AF:00.0");
        let mut state: nvmlEnableState_t = 0;
        assert_eq!(
            call!(nvmlDeviceGetNvLinkState(gpu(0), 12, &mut state)),
            rc::NOT_SUPPORTED
        );
    }
    {
        let _g = start(fixture("mixed"));
        assert_eq!(name(gpu(0)), "NVIDIA A100-SXM4-40GB");
        assert_eq!(name(gpu(3)), "NVIDIA L40S");
        assert_eq!(p2p(0, 1, nvl), ok);
        assert_eq!(p2p(0, 2, nvl), not);
        assert_eq!(level(2, 3), nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE);
        let mut state: nvmlEnableState_t = 0;
        assert_eq!(
            call!(nvmlDeviceGetNvLinkState(gpu(2), 0, &mut state)),
            rc::NOT_SUPPORTED
        );
    }
}

#[test]
fn empty_node_has_a_driver_and_no_gpus() {
    let _g = start(fixture("empty"));
    let mut n: c_uint = 9;
    assert_eq!(call!(nvmlDeviceGetCount_v2(&mut n)), rc::SUCCESS);
    assert_eq!(n, 0);
    assert_eq!(
        string(|b, l| call!(nvmlSystemGetDriverVersion(b, l))),
        Ok("570.133.20".into())
    );
}

#[test]
fn dgx_a100_is_mig_capable_but_disabled() {
    let _g = start(fixture("dgx-a100"));
    let h = gpu(7);
    assert_eq!(name(h), "NVIDIA A100-SXM4-80GB");
    let mut mem = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    assert_eq!(call!(nvmlDeviceGetMemoryInfo(h, &mut mem)), rc::SUCCESS);
    assert_eq!(mem.total, 81920 << 20);
    let (mut cur, mut pend) = (9, 9);
    assert_eq!(
        call!(nvmlDeviceGetMigMode(h, &mut cur, &mut pend)),
        rc::SUCCESS
    );
    assert_eq!((cur, pend), (0, 0));
    let mut links = 0;
    for l in 0..12 {
        let mut state: nvmlEnableState_t = 0;
        assert_eq!(
            call!(nvmlDeviceGetNvLinkState(h, l, &mut state)),
            rc::SUCCESS
        );
        links += state;
    }
    assert_eq!(links, 12);
}

fn fabric_v2(h: nvmlDevice_t) -> (nvmlReturn_t, nvmlGpuFabricInfo_v2_t) {
    let mut info = nvmlGpuFabricInfo_v2_t {
        version: 0x0200_0024,
        clusterUuid: [0xAA; 16],
        status: 0xAA,
        cliqueId: 0xAA,
        state: 0xAA,
        healthMask: 0xAA,
    };
    let code = call!(nvmlDeviceGetGpuFabricInfoV(
        h,
        (&raw mut info).cast::<nvmlGpuFabricInfoV_t>()
    ));
    (code, info)
}

#[test]
fn fabric_info_outside_a_fabric_is_state_not_supported() {
    let _g = start(fixture("dgx-h100"));
    let (code, info) = fabric_v2(gpu(0));
    assert_eq!(code, rc::SUCCESS);
    assert_eq!(
        (info.clusterUuid, info.status, info.cliqueId, info.state),
        (
            [0; 16],
            rc::SUCCESS,
            0,
            NVML_GPU_FABRIC_STATE_NOT_SUPPORTED as u8
        )
    );
}

#[test]
fn fabric_info_of_a_fabric_attached_gpu_in_every_layout() {
    let _g = start(fixture("gb200-nvl"));
    let uuid = [
        0x3f, 0x5a, 0x0c, 0x2e, 0x9b, 0x1d, 0x4e, 0x7a, 0x8c, 0x63, 0x1d, 0x2e, 0x4f, 0x5a, 0x6b,
        0x7c,
    ];
    let completed = NVML_GPU_FABRIC_STATE_COMPLETED as u8;
    for index in 0..4 {
        let h = gpu(index);
        let (code, v2) = fabric_v2(h);
        assert_eq!(code, rc::SUCCESS);
        assert_eq!(
            (
                v2.version,
                v2.clusterUuid,
                v2.status,
                v2.cliqueId,
                v2.state,
                v2.healthMask
            ),
            (0x0200_0024, uuid, rc::SUCCESS, 32766, completed, 0)
        );

        let mut v1 = nvmlGpuFabricInfo_t {
            clusterUuid: [0; 16],
            status: 0xAA,
            cliqueId: 0,
            state: 0,
        };
        assert_eq!(call!(nvmlDeviceGetGpuFabricInfo(h, &mut v1)), rc::SUCCESS);
        assert_eq!(
            (v1.clusterUuid, v1.status, v1.cliqueId, v1.state),
            (uuid, rc::SUCCESS, 32766, completed)
        );

        let mut v3 = nvmlGpuFabricInfo_v3_t {
            version: 0x0300_0028,
            clusterUuid: [0; 16],
            status: 0xAA,
            cliqueId: 0,
            state: 0,
            healthMask: 0xAA,
            healthSummary: 0xAA,
        };
        assert_eq!(call!(nvmlDeviceGetGpuFabricInfoV(h, &mut v3)), rc::SUCCESS);
        assert_eq!(
            (
                v3.clusterUuid,
                v3.cliqueId,
                v3.state,
                v3.healthMask,
                v3.healthSummary
            ),
            (uuid, 32766, completed, 0, 0)
        );
    }
}

#[test]
fn fabric_info_checks_version_pointer_and_handle_kind() {
    let _g = start(fixture("a100-mig"));
    let mut wrong = nvmlGpuFabricInfo_v3_t {
        version: 0x0100_0024,
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
        healthMask: 0,
        healthSummary: 0,
    };
    assert_eq!(
        call!(nvmlDeviceGetGpuFabricInfoV(gpu(0), &mut wrong)),
        rc::ARGUMENT_VERSION_MISMATCH
    );
    assert_eq!(
        call!(nvmlDeviceGetGpuFabricInfoV(gpu(0), null_mut())),
        rc::INVALID_ARGUMENT
    );
    assert_eq!(
        call!(nvmlDeviceGetGpuFabricInfo(gpu(0), null_mut())),
        rc::INVALID_ARGUMENT
    );
    let mut mig: nvmlDevice_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetMigDeviceHandleByIndex(gpu(0), 0, &mut mig)),
        rc::SUCCESS
    );
    let (code, _) = fabric_v2(mig);
    assert_eq!(code, rc::NOT_SUPPORTED);
}

#[test]
fn fabric_info_writes_fields_and_leaves_padding_as_the_real_library_does() {
    // What a real H200 (driver 580.159.04) wrote into buffers prefilled with 0xAA: every field
    // through v1 and v2 but not the three padding bytes after `state`; through v3 only `state`.
    #[repr(C, align(4))]
    struct Buf<const N: usize>([u8; N]);
    let _g = start(fixture("dgx-h100"));
    let mut v1 = Buf([0xAAu8; 28]);
    assert_eq!(
        call!(nvmlDeviceGetGpuFabricInfo(
            gpu(0),
            (&raw mut v1).cast::<nvmlGpuFabricInfo_t>()
        )),
        rc::SUCCESS
    );
    let mut want = [0u8; 28];
    want[25..].copy_from_slice(&[0xAA; 3]);
    assert_eq!(v1.0, want);

    let mut v2 = Buf([0xAAu8; 36]);
    v2.0[..4].copy_from_slice(&0x0200_0024u32.to_ne_bytes());
    assert_eq!(
        call!(nvmlDeviceGetGpuFabricInfoV(
            gpu(0),
            (&raw mut v2).cast::<nvmlGpuFabricInfoV_t>()
        )),
        rc::SUCCESS
    );
    let mut want = [0u8; 36];
    want[..4].copy_from_slice(&0x0200_0024u32.to_ne_bytes());
    want[29..32].copy_from_slice(&[0xAA; 3]);
    assert_eq!(v2.0, want);

    let mut v3 = Buf([0xAAu8; 40]);
    v3.0[..4].copy_from_slice(&0x0300_0028u32.to_ne_bytes());
    assert_eq!(
        call!(nvmlDeviceGetGpuFabricInfoV(
            gpu(0),
            (&raw mut v3).cast::<nvmlGpuFabricInfoV_t>()
        )),
        rc::SUCCESS
    );
    let mut want = [0xAAu8; 40];
    want[..4].copy_from_slice(&0x0300_0028u32.to_ne_bytes());
    want[28] = 0;
    assert_eq!(v3.0, want);
}

#[test]
fn compute_mode_is_set_and_persists_across_sessions() {
    let dir = scratch("compute-mode");
    let state = dir.join("state.json");
    let config = Config {
        state: Some(state.clone()),
        ..fixture("pcie-4gpu")
    };
    let mode = |h| {
        let mut m: nvmlComputeMode_t = 99;
        assert_eq!(call!(nvmlDeviceGetComputeMode(h, &mut m)), rc::SUCCESS);
        m
    };
    {
        let _g = start(config.clone());
        assert_eq!(mode(gpu(1)), nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT);
        assert_eq!(
            call!(nvmlDeviceSetComputeMode(
                gpu(1),
                nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            )),
            rc::SUCCESS
        );
        // EXCLUSIVE_THREAD was removed from the driver.
        assert_eq!(
            call!(nvmlDeviceSetComputeMode(
                gpu(2),
                nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD
            )),
            rc::INVALID_ARGUMENT
        );
        assert_eq!(
            mode(gpu(1)),
            nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
        );
        assert_eq!(mode(gpu(2)), nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT);
    }
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(file["compute_modes"].as_object().unwrap().len(), 1);
    {
        // Another process sees it, and setting it back removes the entry.
        let _g = start(config.clone());
        assert_eq!(
            mode(gpu(1)),
            nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
        );
        assert_eq!(
            call!(nvmlDeviceSetComputeMode(
                gpu(1),
                nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT
            )),
            rc::SUCCESS
        );
    }
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert!(file.get("compute_modes").is_none(), "{file}");
}
