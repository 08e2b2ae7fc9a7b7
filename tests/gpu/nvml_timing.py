"""Times, through pynvml, each NVML call gpud's exporter makes per GPU in one sample cycle, so
a slow sample cycle on a real GPU can be traced to the calls that cost. Read-only."""

import statistics
import time

import pynvml as n

REPS = 20


def timed(label, call, *args):
    times = []
    result = None
    for _ in range(REPS):
        start = time.perf_counter()
        try:
            result = call(*args)
        except n.NVMLError as err:
            result = f"<{err}>"
        times.append((time.perf_counter() - start) * 1000)
    print(f"{label:<34} median {statistics.median(times):8.3f} ms  max {max(times):8.3f} ms  -> {str(result)[:60]}")


n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
timed("nvmlDeviceGetMemoryInfo", n.nvmlDeviceGetMemoryInfo, h)
timed("nvmlDeviceGetUtilizationRates", n.nvmlDeviceGetUtilizationRates, h)
timed("nvmlDeviceGetRemappedRows", n.nvmlDeviceGetRemappedRows, h)
timed("nvmlDeviceGetClockInfo(SM)", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
timed("nvmlDeviceGetClockInfo(MEM)", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)
timed("nvmlDeviceGetTemperature", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
timed("nvmlDeviceGetPowerUsage", n.nvmlDeviceGetPowerUsage, h)
timed("nvmlDeviceGetEnforcedPowerLimit", n.nvmlDeviceGetEnforcedPowerLimit, h)
timed("nvmlDeviceGetTotalEnergyConsumption", n.nvmlDeviceGetTotalEnergyConsumption, h)
timed("nvmlDeviceGetPcieReplayCounter", n.nvmlDeviceGetPcieReplayCounter, h)
timed("nvmlDeviceGetEncoderUtilization", n.nvmlDeviceGetEncoderUtilization, h)
timed("nvmlDeviceGetDecoderUtilization", n.nvmlDeviceGetDecoderUtilization, h)
timed("nvmlDeviceGetPcieThroughput(TX)", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)
timed("nvmlDeviceGetPcieThroughput(RX)", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
timed("nvmlDeviceGetTotalEccErrors(vol)", n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
timed("nvmlDeviceGetPerformanceState", n.nvmlDeviceGetPerformanceState, h)
timed("nvmlDeviceGetFieldValues(memtemp)", n.nvmlDeviceGetFieldValues, h, [n.NVML_FI_DEV_MEMORY_TEMP])
timed("nvmlDeviceGetFieldValues(8 fields)", n.nvmlDeviceGetFieldValues, h, [
    n.NVML_FI_DEV_MEMORY_TEMP, n.NVML_FI_DEV_RETIRED_SBE, n.NVML_FI_DEV_RETIRED_DBE,
    n.NVML_FI_DEV_RETIRED_PENDING, n.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, n.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    n.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL])
timed("nvmlDeviceGetComputeRunningProcesses", n.nvmlDeviceGetComputeRunningProcesses, h)
timed("nvmlDeviceGetNumaNodeId", n.nvmlDeviceGetNumaNodeId, h)
try:
    s1 = n.nvmlGpmSampleAlloc()
    s2 = n.nvmlGpmSampleAlloc()
    timed("nvmlGpmSampleGet", n.nvmlGpmSampleGet, h, s1)
    n.nvmlGpmSampleGet(h, s2)
    # One metrics computation over the two samples, as gpud does once per cycle.
    req = n.c_nvmlGpmMetricsGet_t()
    req.version = n.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = 2
    req.sample1 = s1
    req.sample2 = s2
    req.metrics[0].metricId = n.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    req.metrics[1].metricId = n.NVML_GPM_METRIC_PCIE_RX_PER_SEC
    timed("nvmlGpmMetricsGet(2 metrics)", n.nvmlGpmMetricsGet, req)
except (n.NVMLError, AttributeError) as err:
    print("GPM:", err)
start = time.perf_counter()
n.nvmlShutdown()
n.nvmlInit()
print(f"nvmlShutdown+nvmlInit {1000 * (time.perf_counter() - start):.1f} ms")
n.nvmlShutdown()
