//! Dynamic Resource Allocation: gpud as the kubelet plugin of driver `gpu.nvidia.com`.

pub mod names;
