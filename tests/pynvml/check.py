"""Checks the mock libnvidia-ml.so.1 through NVIDIA's own Python bindings (pynvml).

pynvml resolves every symbol lazily by name and uses the versioned structs of NVML 12/13, so
this catches exports with the wrong name, signature or struct layout that Rust tests calling
the functions directly cannot. Run it through run.sh, which sets up LD_LIBRARY_PATH.

The mock reads its NVML_MOCK_* settings at every first nvmlInit, so each scenario sets the
environment, initialises, checks, and shuts down again, all in this one process.
"""

import ctypes
import json
import os
import threading
import time
import uuid

import pynvml as nv

TMP = os.environ["PYNVML_CHECK_TMP"]
FIXTURES = os.environ["PYNVML_CHECK_FIXTURES"]
MIB = 1 << 20
NO_INSTANCE = 0xFFFFFFFF


def fixture(name):
    with open(os.path.join(FIXTURES, name + ".json")) as f:
        return json.load(f)


def configure(**settings):
    for key in ("NVML_MOCK_FIXTURE", "NVML_MOCK_CLOCK", "NVML_MOCK_STATE", "NVML_MOCK_CONTROL"):
        os.environ.pop(key, None)
    for key, value in settings.items():
        os.environ["NVML_MOCK_" + key.upper()] = str(value)


def expect_error(error_class, fn, *args):
    try:
        fn(*args)
    except error_class:
        return
    raise AssertionError(f"{fn.__name__}{args} did not raise {error_class.__name__}")


def check_inventory():
    configure(fixture="dgx-h100", clock=1000)
    nv.nvmlInit()
    spec = fixture("dgx-h100")
    assert nv.nvmlSystemGetDriverVersion() == "570.133.20"
    assert nv.nvmlSystemGetNVMLVersion() == "12.570.133.20"
    assert nv.nvmlSystemGetCudaDriverVersion() == 12080
    assert nv.nvmlDeviceGetCount() == 8
    # Golden telemetry for NVML_MOCK_CLOCK=1000: temperature °C, power mW.
    golden = [(59, 376150), (45, 183904), (37, 139501), (68, 518486),
              (55, 210160), (51, 206351), (58, 391062), (53, 296799)]
    for i, gpu in enumerate(spec["gpus"]):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        assert nv.nvmlDeviceGetIndex(h) == i
        assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        assert nv.nvmlDeviceGetUUID(h) == gpu["uuid"]
        assert nv.nvmlDeviceGetSerial(h) == gpu["serial"]
        pci = nv.nvmlDeviceGetPciInfo(h)
        assert pci.busId == gpu["pci_bus_id"], pci.busId
        assert pci.busIdLegacy == gpu["pci_bus_id"][4:], pci.busIdLegacy
        assert pci.pciDeviceId == 0x233010DE
        v1 = nv.nvmlDeviceGetMemoryInfo(h)
        v2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        assert v1.total == v2.total == 81559 * MIB
        assert v2.reserved == 325 * MIB
        assert v2.used + v2.free + v2.reserved == v2.total
        assert v1.used == v2.used + v2.reserved and v1.free == v2.free
        assert (nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                nv.nvmlDeviceGetPowerUsage(h)) == golden[i]
        assert nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 89
        assert nv.nvmlDeviceGetPowerManagementLimit(h) == 700000
        assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
        assert nv.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert nv.nvmlDeviceGetNvLinkState(h, 0) == nv.NVML_FEATURE_ENABLED
        expect_error(nv.NVMLError_NotSupported, nv.nvmlDeviceGetFanSpeed, h)
    by_uuid = nv.nvmlDeviceGetHandleByUUID(spec["gpus"][3]["uuid"])
    assert nv.nvmlDeviceGetIndex(by_uuid) == 3
    assert nv.nvmlDeviceGetTopologyCommonAncestor(
        nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(7)) == nv.NVML_TOPOLOGY_SYSTEM
    assert nv.nvmlDeviceGetComputeRunningProcesses(by_uuid) == []
    # nvitop and nvitop-exporter list graphics and MPS processes beside compute ones.
    assert nv.nvmlDeviceGetGraphicsRunningProcesses(by_uuid) == []
    assert nv.nvmlDeviceGetMPSComputeRunningProcesses(by_uuid) == []
    assert nv.nvmlDeviceGetDisplayActive(by_uuid) == nv.NVML_FEATURE_DISABLED
    assert nv.nvmlDeviceGetDisplayMode(by_uuid) == nv.NVML_FEATURE_DISABLED
    expect_error(nv.NVMLError_NotSupported, nv.nvmlDeviceGetCurrentDriverModel, by_uuid)
    expect_error(nv.NVMLError_InvalidArgument, nv.nvmlDeviceGetHandleByIndex, 8)
    nv.nvmlShutdown()
    print("ok   inventory (dgx-h100)")


def check_mig():
    configure(fixture="a100-mig", clock=1000)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
    assert nv.nvmlDeviceGetMigMode(h) == [1, 1]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    expected = [(1, "3g.40gb", 40192), (4, "2g.20gb", 19968), (8, "1g.10gb", 9728)]
    for index, (gi, profile, mib) in enumerate(expected):
        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
        # pynvml returns the c_uint itself here, not its value.
        assert nv.nvmlDeviceIsMigDeviceHandle(mig).value == 1
        assert nv.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG " + profile
        assert nv.nvmlDeviceGetUUID(mig).startswith("MIG-")
        assert nv.nvmlDeviceGetGpuInstanceId(mig) == gi
        assert nv.nvmlDeviceGetComputeInstanceId(mig) == 0
        assert nv.nvmlDeviceGetMemoryInfo(mig).total == mib * MIB
        parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert nv.nvmlDeviceGetUUID(parent) == nv.nvmlDeviceGetUUID(h)
    expect_error(nv.NVMLError_NotFound, nv.nvmlDeviceGetMigDeviceHandleByIndex, h, 3)
    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB) == (19, 1, 7, 9728)
    assert info.name == "MIG 1g.10gb", info.name
    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.multiprocessorCount, info.name) == (9, 42, "MIG 3g.40gb")
    gi = nv.nvmlDeviceGetGpuInstanceById(h, 1)
    ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, nv.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    assert (ci_info.name, ci_info.instanceCount) == ("MIG 1c.3g.40gb", 3)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == 1
    nv.nvmlShutdown()
    print("ok   MIG (a100-mig)")


def check_fabric():
    # Outside a fabric: what a real H200 (driver 580.159.04) answered through this call.
    configure(fixture="dgx-h100")
    nv.nvmlInit()
    info = nv.c_nvmlGpuFabricInfo_v2_t()
    nv.nvmlDeviceGetGpuFabricInfoV(nv.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert (info.state, info.status, info.cliqueId) == (nv.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0, 0)
    assert bytes(info.clusterUuid) == bytes(16)
    nv.nvmlShutdown()

    configure(fixture="gb200-nvl")
    nv.nvmlInit()
    spec = fixture("gb200-nvl")
    for i, gpu in enumerate(spec["gpus"]):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        assert nv.nvmlDeviceGetName(h) == "NVIDIA GB200"
        assert nv.nvmlDeviceGetCudaComputeCapability(h) == (10, 0)
        assert nv.nvmlDeviceGetArchitecture(h) == nv.NVML_DEVICE_ARCH_BLACKWELL
        expect_error(nv.NVMLError_NotSupported, nv.nvmlDeviceGetMigMode, h)
        want_uuid = uuid.UUID(gpu["fabric"]["cluster_uuid"]).bytes
        v2 = nv.c_nvmlGpuFabricInfo_v2_t()
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2))
        v3 = nv.c_nvmlGpuFabricInfo_v3_t()
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))
        v1 = nv.c_nvmlGpuFabricInfo_t()
        nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(v1))
        for info in (v1, v2, v3):
            assert bytes(info.clusterUuid) == want_uuid, bytes(info.clusterUuid).hex()
            assert info.cliqueId == gpu["fabric"]["clique_id"] == 32766
            assert info.state == nv.NVML_GPU_FABRIC_STATE_COMPLETED
            assert info.status == nv.NVML_SUCCESS
    nv.nvmlShutdown()
    print("ok   fabric (dgx-h100 outside one, gb200-nvl in one; v1, v2, v3 layouts)")


def check_events():
    control = os.path.join(TMP, "control")
    open(control, "w").close()
    configure(fixture="a100-mig", control=control)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
    event_set = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)

    start = time.monotonic()
    expect_error(nv.NVMLError_Timeout, nv.nvmlEventSetWait, event_set, 100)
    assert time.monotonic() - start >= 0.09

    def append(line):
        time.sleep(0.05)
        with open(control, "a") as f:
            f.write(line)

    writer = threading.Thread(target=append, args=("xid 0 79\n",))
    writer.start()
    data = nv.nvmlEventSetWait(event_set, 5000)
    writer.join()
    assert data.eventType == nv.nvmlEventTypeXidCriticalError
    assert data.eventData == 79
    assert (data.gpuInstanceId, data.computeInstanceId) == (NO_INSTANCE, NO_INSTANCE)
    assert nv.nvmlDeviceGetUUID(data.device) == nv.nvmlDeviceGetUUID(h)

    append("xid %s 31\n" % nv.nvmlDeviceGetUUID(mig))
    data = nv.nvmlEventSetWait(event_set, 5000)
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (31, 8, 0)

    append("lost 0\n")
    deadline = time.monotonic() + 2
    while True:
        try:
            nv.nvmlDeviceGetName(h)
        except nv.NVMLError_GpuIsLost:
            break
        assert time.monotonic() < deadline, "lost GPU still answers"
        time.sleep(0.005)
    expect_error(nv.NVMLError_GpuIsLost, nv.nvmlDeviceGetHandleByIndex, 0)
    assert nv.nvmlDeviceGetCount() == 1
    nv.nvmlEventSetFree(event_set)
    nv.nvmlShutdown()
    expect_error(nv.NVMLError_Uninitialized, nv.nvmlDeviceGetCount)
    print("ok   events and faults (xid, MIG attribution, lost)")


if __name__ == "__main__":
    check_inventory()
    check_mig()
    check_fabric()
    check_events()
    print("pynvml check passed")
