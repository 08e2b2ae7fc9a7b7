//! MIG through the C API: the pre-built `a100-mig` layout, profile and placement queries,
//! creating and destroying instances, the state file shared between sessions, and the
//! reset-required mode change.

use std::os::raw::c_uint;
use std::ptr::null_mut;

use crate::common::*;

fn mig_handle(parent: nvmlDevice_t, index: c_uint) -> Result<nvmlDevice_t, nvmlReturn_t> {
    let mut h: nvmlDevice_t = null_mut();
    match call!(nvmlDeviceGetMigDeviceHandleByIndex(parent, index, &mut h)) {
        0 => Ok(h),
        code => Err(code),
    }
}

fn ids(h: nvmlDevice_t) -> (c_uint, c_uint) {
    let (mut gi, mut ci) = (99, 99);
    assert_eq!(call!(nvmlDeviceGetGpuInstanceId(h, &mut gi)), rc::SUCCESS);
    assert_eq!(
        call!(nvmlDeviceGetComputeInstanceId(h, &mut ci)),
        rc::SUCCESS
    );
    (gi, ci)
}

fn mig_mode(h: nvmlDevice_t) -> (c_uint, c_uint) {
    let (mut cur, mut pend) = (9, 9);
    assert_eq!(
        call!(nvmlDeviceGetMigMode(h, &mut cur, &mut pend)),
        rc::SUCCESS
    );
    (cur, pend)
}

fn empty_gi_info() -> nvmlGpuInstanceProfileInfo_v2_t {
    nvmlGpuInstanceProfileInfo_v2_t {
        version: 0x0200_0098,
        id: 0,
        isP2pSupported: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
        name: [0; 96],
    }
}

#[test]
fn a100_mig_devices() {
    let _g = start(fixture("a100-mig"));
    let parent = gpu(0);
    assert_eq!(mig_mode(parent), (1, 1));
    let mut max = 0;
    assert_eq!(
        call!(nvmlDeviceGetMaxMigDeviceCount(parent, &mut max)),
        rc::SUCCESS
    );
    assert_eq!(max, 7);
    let expected = [
        ((1, 0), "3g.40gb", 42, 40192),
        ((4, 0), "2g.20gb", 28, 19968),
        ((8, 0), "1g.10gb", 14, 9728),
    ];
    for (i, (want_ids, profile, sm, mem_mib)) in expected.into_iter().enumerate() {
        let h = mig_handle(parent, i as c_uint).unwrap();
        assert_eq!(ids(h), want_ids);
        assert_eq!(name(h), format!("NVIDIA A100-SXM4-80GB MIG {profile}"));
        let u = uuid(h);
        assert!(u.starts_with("MIG-") && u.len() == 40, "{u}");
        let mut by_uuid: nvmlDevice_t = null_mut();
        let cu = std::ffi::CString::new(u).unwrap();
        assert_eq!(
            call!(nvmlDeviceGetHandleByUUID(cu.as_ptr(), &mut by_uuid)),
            rc::SUCCESS
        );
        assert_eq!(by_uuid, h);
        let mut is_mig = 0;
        assert_eq!(
            call!(nvmlDeviceIsMigDeviceHandle(h, &mut is_mig)),
            rc::SUCCESS
        );
        assert_eq!(is_mig, 1);
        let mut back: nvmlDevice_t = null_mut();
        assert_eq!(
            call!(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h, &mut back)),
            rc::SUCCESS
        );
        assert_eq!(back, parent);
        let mut attrs = nvmlDeviceAttributes_t {
            multiprocessorCount: 0,
            sharedCopyEngineCount: 0,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
            gpuInstanceSliceCount: 0,
            computeInstanceSliceCount: 0,
            memorySizeMB: 0,
        };
        assert_eq!(
            call!(nvmlDeviceGetAttributes_v2(h, &mut attrs)),
            rc::SUCCESS
        );
        assert_eq!(
            (attrs.multiprocessorCount, attrs.memorySizeMB),
            (sm, mem_mib)
        );
        let mut mem = nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        assert_eq!(call!(nvmlDeviceGetMemoryInfo(h, &mut mem)), rc::SUCCESS);
        assert_eq!(mem.total, mem_mib << 20);
        assert_eq!(mem.free + mem.used, mem.total);
        let mut minor = 9;
        assert_eq!(call!(nvmlDeviceGetMinorNumber(h, &mut minor)), rc::SUCCESS);
        assert_eq!(minor, 0);
        let mut index = 0;
        assert_eq!(call!(nvmlDeviceGetIndex(h, &mut index)), rc::NOT_SUPPORTED);
    }
    assert_eq!(mig_handle(parent, 3), Err(rc::NOT_FOUND));
    assert_eq!(mig_handle(parent, 7), Err(rc::INVALID_ARGUMENT));
    let (mut gi, mut is_mig) = (0, 9);
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceId(parent, &mut gi)),
        rc::NOT_SUPPORTED
    );
    assert_eq!(
        call!(nvmlDeviceIsMigDeviceHandle(parent, &mut is_mig)),
        rc::SUCCESS
    );
    assert_eq!(is_mig, 0);
}

#[test]
fn profile_queries() {
    let _g = start(fixture("a100-mig"));
    let h = gpu(0);
    let mut info = nvmlGpuInstanceProfileInfo_t {
        id: 0,
        isP2pSupported: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
    };
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceProfileInfo(
            h,
            NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            &mut info
        )),
        rc::SUCCESS
    );
    assert_eq!(
        (
            info.id,
            info.instanceCount,
            info.memorySizeMB,
            info.multiprocessorCount
        ),
        (19, 7, 9728, 14)
    );
    let mut v2 = empty_gi_info();
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceProfileInfoV(
            h,
            NVML_GPU_INSTANCE_PROFILE_7_SLICE,
            &mut v2
        )),
        rc::SUCCESS
    );
    assert_eq!(
        (v2.id, v2.sliceCount, v2.memorySizeMB, v2.decoderCount),
        (0, 7, 80896, 5)
    );
    assert_eq!(c_field(&v2.name), "MIG 7g.80gb");
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceProfileInfoV(
            h,
            NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
            &mut v2
        )),
        rc::SUCCESS
    );
    assert_eq!(c_field(&v2.name), "MIG 1g.20gb");
    let mut bad = empty_gi_info();
    bad.version = 0x0100_0098;
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceProfileInfoV(h, 0, &mut bad)),
        rc::ARGUMENT_VERSION_MISMATCH
    );
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceProfileInfo(
            h,
            NVML_GPU_INSTANCE_PROFILE_8_SLICE,
            &mut info
        )),
        rc::NOT_SUPPORTED
    );
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceProfileInfo(h, 0x12, &mut info)),
        rc::INVALID_ARGUMENT
    );

    // Placements: count first, then the array.
    let mut count: c_uint = 0;
    assert_eq!(
        call!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            h,
            19,
            null_mut(),
            &mut count
        )),
        rc::SUCCESS
    );
    assert_eq!(count, 7);
    let mut placements = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 7];
    let mut small: c_uint = 2;
    assert_eq!(
        call!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            h,
            9,
            placements.as_mut_ptr(),
            &mut small
        )),
        rc::SUCCESS
    );
    assert_eq!(small, 2);
    assert_eq!((placements[1].start, placements[1].size), (4, 4));
    assert_eq!(
        call!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            h,
            19,
            placements.as_mut_ptr(),
            &mut small
        )),
        rc::INSUFFICIENT_SIZE
    );
    assert_eq!(small, 7);

    // What is left next to 3g@4, 2g@2, 1g@1: memory slice 0.
    let remaining = |profile: c_uint| {
        let mut n = 99;
        assert_eq!(
            call!(nvmlDeviceGetGpuInstanceRemainingCapacity(
                h, profile, &mut n
            )),
            rc::SUCCESS
        );
        n
    };
    assert_eq!(
        (remaining(19), remaining(14), remaining(15), remaining(0)),
        (1, 0, 0, 0)
    );

    // GIs and CIs of the 3g.
    let mut gis = [null_mut(); 2];
    assert_eq!(
        call!(nvmlDeviceGetGpuInstances(
            h,
            9,
            gis.as_mut_ptr(),
            &mut count
        )),
        rc::SUCCESS
    );
    assert_eq!(count, 1);
    let mut by_id: nvmlGpuInstance_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceById(h, 1, &mut by_id)),
        rc::SUCCESS
    );
    assert_eq!(by_id, gis[0]);
    assert_eq!(
        call!(nvmlDeviceGetGpuInstanceById(h, 2, &mut by_id)),
        rc::NOT_FOUND
    );
    let mut gi_info = nvmlGpuInstanceInfo_t {
        device: null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    assert_eq!(
        call!(nvmlGpuInstanceGetInfo(gis[0], &mut gi_info)),
        rc::SUCCESS
    );
    assert_eq!(
        (
            gi_info.device,
            gi_info.id,
            gi_info.profileId,
            gi_info.placement.start
        ),
        (h, 1, 9, 4)
    );

    let mut ci_info = nvmlComputeInstanceProfileInfo_v2_t {
        version: 0x0200_0088,
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
        name: [0; 96],
    };
    assert_eq!(
        call!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(
            gis[0],
            0,
            0,
            &mut ci_info
        )),
        rc::SUCCESS
    );
    assert_eq!(
        (
            c_field(&ci_info.name),
            ci_info.instanceCount,
            ci_info.multiprocessorCount
        ),
        ("MIG 1c.3g.40gb".into(), 3, 14)
    );
    assert_eq!(
        call!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(
            gis[0],
            2,
            0,
            &mut ci_info
        )),
        rc::SUCCESS
    );
    assert_eq!(c_field(&ci_info.name), "MIG 3g.40gb");
    assert_eq!(
        call!(nvmlGpuInstanceGetComputeInstanceProfileInfoV(
            gis[0],
            3,
            0,
            &mut ci_info
        )),
        rc::NOT_SUPPORTED
    );
    let mut cis = [null_mut(); 1];
    assert_eq!(
        call!(nvmlGpuInstanceGetComputeInstances(
            gis[0],
            2,
            cis.as_mut_ptr(),
            &mut count
        )),
        rc::SUCCESS
    );
    assert_eq!(count, 1);
    let mut info2 = nvmlComputeInstanceInfo_t {
        device: null_mut(),
        gpuInstance: null_mut(),
        id: 9,
        profileId: 0,
        placement: nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    };
    assert_eq!(
        call!(nvmlComputeInstanceGetInfo_v2(cis[0], &mut info2)),
        rc::SUCCESS
    );
    assert_eq!(
        (
            info2.device,
            info2.gpuInstance,
            info2.id,
            info2.profileId,
            info2.placement.size
        ),
        (h, gis[0], 0, 2, 3)
    );
    let mut left = 9;
    assert_eq!(
        call!(nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
            gis[0], 0, &mut left
        )),
        rc::SUCCESS
    );
    assert_eq!(left, 0);
}

#[test]
fn reconfigure_and_persist_across_sessions() {
    let dir = scratch("mig-persist");
    let state = dir.join("state.json");
    let config = Config {
        state: Some(state.clone()),
        ..fixture("dgx-a100")
    };
    {
        let _g = start(config.clone());
        let h = gpu(0);
        let mut gi: nvmlGpuInstance_t = null_mut();
        assert_eq!(
            call!(nvmlDeviceCreateGpuInstance(h, 9, &mut gi)),
            rc::NOT_SUPPORTED
        );
        let mut status = 99;
        assert_eq!(
            call!(nvmlDeviceSetMigMode(h, NVML_DEVICE_MIG_ENABLE, &mut status)),
            rc::SUCCESS
        );
        assert_eq!(status, rc::SUCCESS);
        assert_eq!(mig_mode(h), (1, 1));
        // mig-parted's all-balanced on an 80GB A100: 3g, 2g, 1g, 1g, largest first.
        let mut created = Vec::new();
        for profile in [9, 14, 19, 19] {
            assert_eq!(
                call!(nvmlDeviceCreateGpuInstance(h, profile, &mut gi)),
                rc::SUCCESS
            );
            let mut ci: nvmlComputeInstance_t = null_mut();
            let full = match profile {
                9 => 2,
                14 => 1,
                _ => 0,
            };
            assert_eq!(
                call!(nvmlGpuInstanceCreateComputeInstance(gi, full, &mut ci)),
                rc::SUCCESS
            );
            created.push(gi);
        }
        assert_eq!(
            call!(nvmlDeviceCreateGpuInstance(h, 19, &mut gi)),
            rc::INSUFFICIENT_RESOURCES
        );
        let all: Vec<_> = (0..4).map(|i| ids(mig_handle(h, i).unwrap())).collect();
        assert_eq!(all, [(1, 0), (4, 0), (7, 0), (8, 0)]);
        assert_eq!(call!(nvmlGpuInstanceDestroy(created[0])), rc::IN_USE);
        assert_eq!(
            call!(nvmlDeviceSetMigMode(
                h,
                NVML_DEVICE_MIG_DISABLE,
                &mut status
            )),
            rc::IN_USE
        );
        assert!(
            std::fs::read_to_string(&state)
                .unwrap()
                .contains("\"profile_id\": 9")
        );
    }
    {
        // A new session (another process, in effect) sees the same node.
        let _g = start(config.clone());
        let h = gpu(0);
        assert_eq!(mig_mode(h), (1, 1));
        let first = mig_handle(h, 0).unwrap();
        assert_eq!(name(first), "NVIDIA A100-SXM4-80GB MIG 3g.40gb");
        let mut gis = [null_mut(); 7];
        let mut count = 0;
        for profile in [9, 14, 19] {
            assert_eq!(
                call!(nvmlDeviceGetGpuInstances(
                    h,
                    profile,
                    gis.as_mut_ptr(),
                    &mut count
                )),
                rc::SUCCESS
            );
            for gi in &gis[..count as usize] {
                let mut cis = [null_mut(); 7];
                let mut n = 0;
                for ci_profile in [0, 1, 2] {
                    if call!(nvmlGpuInstanceGetComputeInstances(
                        *gi,
                        ci_profile,
                        cis.as_mut_ptr(),
                        &mut n
                    )) == rc::SUCCESS
                    {
                        for ci in &cis[..n as usize] {
                            assert_eq!(call!(nvmlComputeInstanceDestroy(*ci)), rc::SUCCESS);
                        }
                    }
                }
                assert_eq!(call!(nvmlGpuInstanceDestroy(*gi)), rc::SUCCESS);
            }
        }
        // The old MIG handle is stale now.
        let mut n = 0;
        assert_eq!(
            call!(nvmlDeviceGetGpuInstanceId(first, &mut n)),
            rc::INVALID_ARGUMENT
        );
        let mut status = 99;
        assert_eq!(
            call!(nvmlDeviceSetMigMode(
                h,
                NVML_DEVICE_MIG_DISABLE,
                &mut status
            )),
            rc::SUCCESS
        );
        assert_eq!(mig_mode(h), (0, 0));
    }
    let _g = start(config);
    assert_eq!(mig_mode(gpu(0)), (0, 0));
}

#[test]
fn explicit_placements() {
    let dir = scratch("mig-placement");
    let _g = start(Config {
        state: Some(dir.join("s.json")),
        ..fixture("a100-mig")
    });
    let h = gpu(0);
    let mut gi: nvmlGpuInstance_t = null_mut();
    let taken = nvmlGpuInstancePlacement_t { start: 1, size: 1 };
    assert_eq!(
        call!(nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 19, &taken, &mut gi
        )),
        rc::INSUFFICIENT_RESOURCES
    );
    let wrong_size = nvmlGpuInstancePlacement_t { start: 0, size: 2 };
    assert_eq!(
        call!(nvmlDeviceCreateGpuInstanceWithPlacement(
            h,
            19,
            &wrong_size,
            &mut gi
        )),
        rc::INVALID_ARGUMENT
    );
    let free = nvmlGpuInstancePlacement_t { start: 0, size: 1 };
    assert_eq!(
        call!(nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 19, &free, &mut gi
        )),
        rc::SUCCESS
    );
    let mut info = nvmlGpuInstanceInfo_t {
        device: null_mut(),
        id: 0,
        profileId: 0,
        placement: free,
    };
    assert_eq!(call!(nvmlGpuInstanceGetInfo(gi, &mut info)), rc::SUCCESS);
    assert_eq!(info.id, 7);
    let mut ci: nvmlComputeInstance_t = null_mut();
    let at = nvmlComputeInstancePlacement_t { start: 0, size: 1 };
    assert_eq!(
        call!(nvmlGpuInstanceCreateComputeInstanceWithPlacement(
            gi, 0, &at, &mut ci
        )),
        rc::SUCCESS
    );
    assert_eq!(ids(mig_handle(h, 3).unwrap()), (8, 0));
    assert_eq!(ids(mig_handle(h, 2).unwrap()), (7, 0));
}

#[test]
fn foreign_state_file_changes_are_picked_up() {
    let dir = scratch("mig-foreign");
    let state = dir.join("state.json");
    let _g = start(Config {
        state: Some(state.clone()),
        ..fixture("a100-mig")
    });
    let h = gpu(0);
    assert!(mig_handle(h, 2).is_ok());
    let uuid = uuid(h);
    let text = format!(
        r#"{{"version": 1, "gpus": {{"{uuid}": {{"current": 1, "pending": 1, "gpu_instances": [
            {{"id": 0, "profile_id": 0, "placement": {{"start": 0, "size": 8}},
              "compute_instances": [{{"id": 0, "profile_id": 4, "placement": {{"start": 0, "size": 7}}}}]}}]}}}}}}"#
    );
    std::fs::write(&state, text).unwrap();
    assert_eq!(
        name(mig_handle(h, 0).unwrap()),
        "NVIDIA A100-SXM4-80GB MIG 7g.80gb"
    );
    assert_eq!(mig_handle(h, 1), Err(rc::NOT_FOUND));
}

#[test]
fn mode_change_waits_for_reset_when_required() {
    let dir = scratch("mig-reset");
    let control = dir.join("control");
    std::fs::write(&control, "").unwrap();
    let config = Config {
        state: Some(dir.join("state.json")),
        control: Some(control.clone()),
        mig_reset_required: true,
        ..fixture("dgx-a100")
    };
    let _g = start(config);
    let h = gpu(1);
    let mut status = 0;
    assert_eq!(
        call!(nvmlDeviceSetMigMode(h, NVML_DEVICE_MIG_ENABLE, &mut status)),
        rc::SUCCESS
    );
    assert_eq!(status, nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED);
    assert_eq!(mig_mode(h), (0, 1));
    let mut gi: nvmlGpuInstance_t = null_mut();
    assert_eq!(
        call!(nvmlDeviceCreateGpuInstance(h, 19, &mut gi)),
        rc::NOT_SUPPORTED
    );
    inject(&control, "reset 1\n");
    assert!(eventually(|| mig_mode(h) == (1, 1)));
    assert_eq!(
        call!(nvmlDeviceCreateGpuInstance(h, 19, &mut gi)),
        rc::SUCCESS
    );
}
