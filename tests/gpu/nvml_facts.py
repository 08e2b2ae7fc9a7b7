"""Reads, through pynvml, the facts gpud's inventory and exporter report, so a run on a real
GPU can be compared field by field with gpud's output. Read-only."""

from ctypes import byref

import pynvml as n


def attempt(call, *args):
    try:
        return call(*args)
    except n.NVMLError as err:
        return f"<{err}>"
    except AttributeError as err:
        return f"<missing in this pynvml: {err}>"


def fabric(h):
    info = n.c_nvmlGpuFabricInfo_v2_t()
    n.nvmlDeviceGetGpuFabricInfoV(h, byref(info))
    return (f"state={info.state} status={info.status} clique={info.cliqueId} "
            f"cluster={bytes(info.clusterUuid).hex()}")


n.nvmlInit()
print("driver", attempt(n.nvmlSystemGetDriverVersion))
print("cuda", attempt(n.nvmlSystemGetCudaDriverVersion_v2))
print("nvml", attempt(n.nvmlSystemGetNVMLVersion))
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    print(f"--- gpu {i}")
    for label, call in [
        ("name", n.nvmlDeviceGetName),
        ("uuid", n.nvmlDeviceGetUUID),
        ("serial", n.nvmlDeviceGetSerial),
        ("pci", lambda h: n.nvmlDeviceGetPciInfo_v3(h).busId),
        ("minor", n.nvmlDeviceGetMinorNumber),
        ("memory total", lambda h: n.nvmlDeviceGetMemoryInfo(h).total),
        ("arch", n.nvmlDeviceGetArchitecture),
        ("cc", n.nvmlDeviceGetCudaComputeCapability),
        ("mig mode", n.nvmlDeviceGetMigMode),
        ("numa", lambda h: n.nvmlDeviceGetNumaNodeId(h)),
        ("power mW", n.nvmlDeviceGetPowerUsage),
        ("energy mJ", n.nvmlDeviceGetTotalEnergyConsumption),
        ("temp", lambda h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        ("util", lambda h: str(n.nvmlDeviceGetUtilizationRates(h))),
        ("ecc mode", n.nvmlDeviceGetEccMode),
        ("remapped rows", n.nvmlDeviceGetRemappedRows),
        ("persistence", n.nvmlDeviceGetPersistenceMode),
        ("compute mode", n.nvmlDeviceGetComputeMode),
        ("gpm support", n.nvmlGpmQueryDeviceSupport),
        ("fabric info", fabric),
        ("virtualization mode", n.nvmlDeviceGetVirtualizationMode),
        ("host vgpu mode", n.nvmlDeviceGetHostVgpuMode),
        ("board part", n.nvmlDeviceGetBoardPartNumber),
        ("vbios", n.nvmlDeviceGetVbiosVersion),
        ("recovery action", lambda h: n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0].value.uiVal),
    ]:
        print(f"{label}: {attempt(call, h)}")
    for g in range(0, 20):
        info = attempt(n.nvmlDeviceGetGpuInstanceProfileInfo, h, g)
        if isinstance(info, str):
            continue
        print(f"mig profile {g}: id={info.id} slices={info.sliceCount} mem={info.memorySizeMB} sm={info.multiprocessorCount}")
n.nvmlShutdown()
