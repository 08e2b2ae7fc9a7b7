//! Compiles the kubelet and container-runtime protos in `proto/` into Rust with protox, a pure-Rust protobuf compiler,
//! so a build needs no system `protoc`.

use std::error::Error;

const PROTOS: &[&str] = &[
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "drahealth/v1/api.proto",
    "drahealth/v1alpha1/api.proto",
    "cri/runtime/v1/api.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
