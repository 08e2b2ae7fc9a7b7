//! The part of the kubelet's CRI API (`runtime.v1.RuntimeService`) a kubelet uses to run a
//! pod, as prost messages with the upstream field numbers, and a client that calls it over a
//! runtime's unix socket. gpud's own proto subset has only the two list calls it needs; these
//! messages carry only the fields the tests send or read (unknown fields are skipped).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `NamespaceMode`: POD = 0, CONTAINER = 1, NODE = 2, TARGET = 3.
pub const NODE: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    #[prost(int32, tag = "1")]
    pub network: i32,
    #[prost(int32, tag = "2")]
    pub pid: i32,
    #[prost(int32, tag = "3")]
    pub ipc: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub readonly: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(string, tag = "3")]
    pub permissions: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerSecurityContext {
    #[prost(bool, tag = "2")]
    pub privileged: bool,
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub envs: Vec<KeyValue>,
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "8")]
    pub devices: Vec<Device>,
    #[prost(map = "string, string", tag = "9")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "10")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "11")]
    pub log_path: String,
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
    /// `CDI_devices` upstream.
    #[prost(message, repeated, tag = "17")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// Start, remove: a request naming only the container.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerIdRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// Stop, remove: a request naming only the sandbox.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

/// `ContainerState`: CREATED = 0, RUNNING = 1, EXITED = 2, UNKNOWN = 3.
pub const RUNNING: i32 = 1;
pub const EXITED: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, repeated, tag = "2")]
    pub cmd: Vec<String>,
    #[prost(int64, tag = "3")]
    pub timeout: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExecSyncResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub stdout: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub stderr: Vec<u8>,
    #[prost(int32, tag = "3")]
    pub exit_code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    #[prost(string, tag = "1")]
    pub id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub image: Option<Image>,
}

/// A client of a runtime's CRI socket.
pub struct Cri {
    grpc: tonic::client::Grpc<Channel>,
}

impl Cri {
    /// A client of `socket` once the runtime answers Version through it: the socket exists
    /// before the daemon listens, and its CRI plugin answers "not initialized" for a moment
    /// after. Fails after 20 s with the last error.
    pub async fn connect(socket: &Path) -> (Cri, VersionResponse) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let error = match Self::try_connect(socket).await {
                Ok(mut cri) => match cri.version().await {
                    Ok(version) => return (cri, version),
                    Err(status) => status.to_string(),
                },
                Err(error) => error.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "the runtime at {} did not answer within 20 s: {error}",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn try_connect(socket: &Path) -> Result<Cri, tonic::transport::Error> {
        let channel = Endpoint::from_shared(format!("unix:{}", socket.display()))?
            .connect()
            .await?;
        Ok(Cri {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// `RuntimeService/<method>` with `request`.
    pub async fn call<Q, A>(&mut self, method: &str, request: Q) -> Result<A, tonic::Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        self.call_service("RuntimeService", method, request).await
    }

    /// `<service>/<method>` of `runtime.v1` with `request`.
    async fn call_service<Q, A>(
        &mut self,
        service: &str,
        method: &str,
        request: Q,
    ) -> Result<A, tonic::Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path =
            http::uri::PathAndQuery::try_from(format!("/runtime.v1.{service}/{method}")).unwrap();
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        self.grpc
            .unary(tonic::Request::new(request), path, codec)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Whether the CRI plugin knows image `name` (it learns of an import from an event).
    pub async fn has_image(&mut self, name: &str) -> bool {
        let request = ImageStatusRequest {
            image: Some(ImageSpec {
                image: name.to_owned(),
            }),
        };
        let answer: ImageStatusResponse = self
            .call_service("ImageService", "ImageStatus", request)
            .await
            .unwrap();
        answer.image.is_some()
    }

    pub async fn version(&mut self) -> Result<VersionResponse, tonic::Status> {
        let request = VersionRequest {
            version: "v1".into(),
        };
        self.call("Version", request).await
    }

    pub async fn run_pod_sandbox(&mut self, config: &PodSandboxConfig) -> String {
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let answer: RunPodSandboxResponse = self.call("RunPodSandbox", request).await.unwrap();
        answer.pod_sandbox_id
    }

    pub async fn create_container(
        &mut self,
        sandbox: &str,
        sandbox_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> Result<String, tonic::Status> {
        let request = CreateContainerRequest {
            pod_sandbox_id: sandbox.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let answer: CreateContainerResponse = self.call("CreateContainer", request).await?;
        Ok(answer.container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<(), tonic::Status> {
        let request = ContainerIdRequest {
            container_id: id.to_owned(),
        };
        let _: Empty = self.call("StartContainer", request).await?;
        Ok(())
    }

    pub async fn container_status(&mut self, id: &str) -> ContainerStatusResponse {
        let request = ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        };
        self.call("ContainerStatus", request).await.unwrap()
    }

    pub async fn exec_sync(&mut self, id: &str, cmd: &[&str]) -> ExecSyncResponse {
        let request = ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 10,
        };
        self.call("ExecSync", request).await.unwrap()
    }

    pub async fn remove_container(&mut self, id: &str) {
        let stop = StopContainerRequest {
            container_id: id.to_owned(),
            timeout: 0,
        };
        let _: Empty = self.call("StopContainer", stop).await.unwrap();
        let remove = ContainerIdRequest {
            container_id: id.to_owned(),
        };
        let _: Empty = self.call("RemoveContainer", remove).await.unwrap();
    }

    pub async fn remove_pod_sandbox(&mut self, id: &str) {
        let request = SandboxIdRequest {
            pod_sandbox_id: id.to_owned(),
        };
        let _: Empty = self.call("StopPodSandbox", request.clone()).await.unwrap();
        let _: Empty = self.call("RemovePodSandbox", request).await.unwrap();
    }
}
