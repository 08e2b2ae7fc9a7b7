//! One client of the container runtime's CRI socket: connects on first use, lists the pod
//! sandboxes and then the containers, each call under a time limit, and connects again after
//! a failure that may be the connection's (a runtime that restarted has a new socket behind
//! the same path).
//!
//! A call that only ran out of time keeps its connection: the runtime accepted it and said
//! nothing, so a new one would find it no different, and a runtime too wedged to read would
//! hold every connection gpud gave up on open, one more per retry, until it ran out of
//! descriptors. The next call goes on the same connection (the stalled one is reset); a
//! runtime that dies closes it, and that failure makes the next list connect again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::proto::cri_runtime::runtime_service_client::RuntimeServiceClient;
use crate::proto::cri_runtime::{
    Container, ListContainersRequest, ListPodSandboxRequest, PodSandbox,
};

/// How long connecting to the socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one list call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer taken: the kubelet's own limit for the runtime's answers (tonic's default,
/// 4 MiB, is a few thousand containers with their labels).
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// Why the runtime's lists could not be had; each names the socket.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("cannot connect to the container runtime's CRI socket {socket}")]
    Connect {
        socket: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the container runtime at {socket} refused {call}")]
    Call {
        socket: String,
        call: &'static str,
        #[source]
        source: tonic::Status,
    },
    #[error("the container runtime at {socket} did not answer {call} within {after:?}")]
    Timeout {
        socket: String,
        call: &'static str,
        after: Duration,
    },
}

/// A client of one CRI socket.
#[derive(Debug)]
pub struct RuntimeClient {
    socket: PathBuf,
    client: Option<RuntimeServiceClient<Channel>>,
}

impl RuntimeClient {
    /// A client of `socket`; nothing is dialled before the first list.
    pub fn new(socket: PathBuf) -> Self {
        RuntimeClient {
            socket,
            client: None,
        }
    }

    /// The socket asked.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every pod sandbox, then every container. A failure drops the connection, but a call
    /// that only timed out, which keeps it for the next list.
    pub async fn list(&mut self) -> Result<(Vec<PodSandbox>, Vec<Container>), CriError> {
        let result = self.list_on().await;
        if let Err(err) = &result
            && !matches!(err, CriError::Timeout { .. })
        {
            self.client = None;
        }
        result
    }

    async fn list_on(&mut self) -> Result<(Vec<PodSandbox>, Vec<Container>), CriError> {
        let socket = self.socket.display().to_string();
        let client = match &mut self.client {
            Some(client) => client,
            None => {
                // tonic dials `unix:` endpoints itself; an absolute path reads `unix:///run/…`.
                let connect = async {
                    Endpoint::from_shared(format!("unix:{socket}"))?
                        .connect_timeout(CONNECT_TIMEOUT)
                        .connect()
                        .await
                };
                let channel = connect.await.map_err(|source| CriError::Connect {
                    socket: socket.clone(),
                    source,
                })?;
                self.client.insert(
                    RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_ANSWER),
                )
            }
        };
        let sandboxes = bounded(&socket, "ListPodSandbox", async {
            client.list_pod_sandbox(ListPodSandboxRequest {}).await
        })
        .await?
        .items;
        let containers = bounded(&socket, "ListContainers", async {
            client.list_containers(ListContainersRequest {}).await
        })
        .await?
        .containers;
        Ok((sandboxes, containers))
    }
}

/// One call under [`CALL_TIMEOUT`].
async fn bounded<T>(
    socket: &str,
    call: &'static str,
    answer: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CriError> {
    match tokio::time::timeout(CALL_TIMEOUT, answer).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(source)) => Err(CriError::Call {
            socket: socket.to_owned(),
            call,
            source,
        }),
        Err(_) => Err(CriError::Timeout {
            socket: socket.to_owned(),
            call,
            after: CALL_TIMEOUT,
        }),
    }
}
