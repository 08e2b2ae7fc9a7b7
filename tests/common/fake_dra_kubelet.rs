//! A fake kubelet's side of DRA: the plugin-registration client (GetInfo, then
//! NotifyRegistrationStatus, as the kubelet's plugin watcher does for a socket it finds in
//! plugins_registry) and the DRAPlugin v1 and v1beta1 client, over unix sockets. Every unary
//! call goes through the raw HTTP/2 client with the socket path as its `:authority`, as
//! kubelets before 1.26 send it (h2 servers refuse that unless they accept any); the health
//! stream uses tonic.

#![allow(dead_code)]

use std::path::Path;

use gpud::proto::drahealth_v1::dra_resource_health_client::DraResourceHealthClient;
use gpud::proto::drahealth_v1alpha1::dra_resource_health_client::DraResourceHealthClient as DraResourceHealthClientV1alpha1;
use gpud::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use gpud::proto::{dra_v1, dra_v1beta1};
use prost::Message;
use tonic::transport::{Channel, Endpoint};

use crate::raw_grpc::{Authority, RawClient};

/// One unary call of `service`/`method` on `socket` with the socket path as `:authority`;
/// the answer, or the gRPC status and message.
pub async fn unary<A: Message + Default>(
    socket: &Path,
    service: &str,
    method: &str,
    request: &impl Message,
) -> Result<A, String> {
    let mut client = RawClient::connect_to(socket, service).await;
    let authority = socket.to_str().unwrap();
    let reply = client
        .call(
            method,
            Authority::Indexed(authority),
            &request.encode_to_vec(),
        )
        .await;
    let trailer = |name: &str| {
        reply
            .trailers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    if trailer("grpc-status") != "0" {
        return Err(format!(
            "{} {}",
            trailer("grpc-status"),
            trailer("grpc-message")
        ));
    }
    Ok(A::decode(reply.messages[0].as_slice()).unwrap())
}

/// Registers the plugin whose registration socket is `socket`, as the kubelet does: GetInfo,
/// then NotifyRegistrationStatus(registered). Returns what GetInfo said.
pub async fn register(socket: &Path) -> PluginInfo {
    let (info, answer) = registration(socket, None).await;
    answer.unwrap();
    info
}

/// Refuses the plugin as a kubelet does that cannot take it: GetInfo, then
/// NotifyRegistrationStatus(not registered, `error`). Returns the plugin's answer to that, a
/// gRPC error as NVIDIA's plugins give.
pub async fn refuse_registration(socket: &Path, error: &str) -> String {
    registration(socket, Some(error)).await.1.unwrap_err()
}

/// GetInfo, then NotifyRegistrationStatus: registered without `refusal`, else refused with it.
async fn registration(socket: &Path, refusal: Option<&str>) -> (PluginInfo, Result<(), String>) {
    let service = "pluginregistration.Registration";
    let info: PluginInfo = unary(socket, service, "GetInfo", &InfoRequest {})
        .await
        .unwrap();
    let status = RegistrationStatus {
        plugin_registered: refusal.is_none(),
        error: refusal.unwrap_or_default().to_owned(),
    };
    let answer =
        unary::<RegistrationStatusResponse>(socket, service, "NotifyRegistrationStatus", &status)
            .await
            .map(|_| ());
    (info, answer)
}

const V1: &str = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin";
const V1BETA1: &str = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin";

/// NodePrepareResources v1.
pub async fn prepare_v1(
    socket: &Path,
    request: dra_v1::NodePrepareResourcesRequest,
) -> dra_v1::NodePrepareResourcesResponse {
    unary(socket, V1, "NodePrepareResources", &request)
        .await
        .unwrap()
}

/// NodeUnprepareResources v1.
pub async fn unprepare_v1(
    socket: &Path,
    request: dra_v1::NodeUnprepareResourcesRequest,
) -> dra_v1::NodeUnprepareResourcesResponse {
    unary(socket, V1, "NodeUnprepareResources", &request)
        .await
        .unwrap()
}

/// NodePrepareResources v1beta1.
pub async fn prepare_v1beta1(
    socket: &Path,
    request: dra_v1beta1::NodePrepareResourcesRequest,
) -> dra_v1beta1::NodePrepareResourcesResponse {
    unary(socket, V1BETA1, "NodePrepareResources", &request)
        .await
        .unwrap()
}

async fn channel(endpoint: &Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", endpoint.display()))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A DRA health v1 client for the plugin socket `endpoint`.
pub async fn health(endpoint: &Path) -> DraResourceHealthClient<Channel> {
    DraResourceHealthClient::new(channel(endpoint).await)
}

/// A DRA health v1alpha1 client (kubelets before the v1 service) for the plugin socket.
pub async fn health_v1alpha1(endpoint: &Path) -> DraResourceHealthClientV1alpha1<Channel> {
    DraResourceHealthClientV1alpha1::new(channel(endpoint).await)
}

/// A claim reference for the v1 API.
pub fn claim_v1(namespace: &str, name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: namespace.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// A claim reference for the v1beta1 API.
pub fn claim_v1beta1(namespace: &str, name: &str, uid: &str) -> dra_v1beta1::Claim {
    dra_v1beta1::Claim {
        namespace: namespace.into(),
        uid: uid.into(),
        name: name.into(),
    }
}
