//! External agents packaged as local container images, run through the Docker engine.
//!
//! The same contract as a command (see [`super::external`]), inside the container: the checkout
//! is mounted at `/repo` (the working directory), the task's directory at `/reprobench/task`
//! (instance file, output patch, artifacts). The container joins [`AGENT_NETWORK`], an internal
//! Docker network with no route out: the only address it reaches is the host's end of that
//! network, where the node's gateway also listens (`OPENAI_BASE_URL`). It does not share the
//! host's network, so the node's loopback services and the outside are out of its reach. The
//! image's entrypoint runs with `command` as its arguments (placeholders name the in-container
//! paths).

use super::external::{ExternalEnd, ExternalInvocation};
use bollard::Docker;
use bollard::errors::Error as EngineError;
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptions, ListNetworksOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use reprobench_gateway::Gateway;
use std::io::Write;
use std::path::Path;
use tokio_util::sync::CancellationToken;

/// Where the checkout is mounted.
pub const REPO_MOUNT: &str = "/repo";
/// Where the task's directory is mounted.
pub const TASK_MOUNT: &str = "/reprobench/task";
/// The internal Docker network agent containers join (created on first use).
pub const AGENT_NETWORK: &str = "reprobench-agents";

/// The networks named exactly [`AGENT_NETWORK`].
async fn agent_networks(docker: &Docker) -> Result<Vec<bollard::models::Network>, String> {
    let filters = std::collections::HashMap::from([("name", vec![AGENT_NETWORK])]);
    let options = ListNetworksOptionsBuilder::new().filters(&filters).build();
    let listed = docker
        .list_networks(Some(options))
        .await
        .map_err(|e| format!("cannot list Docker networks: {e}"))?;
    // The engine's name filter matches parts of names too.
    Ok(listed
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(AGENT_NETWORK))
        .collect())
}

/// The id of [`AGENT_NETWORK`] and the host's address on it, creating the network when it is
/// missing. A network of that name that is not internal is refused: agents on it would reach
/// the outside. Docker allows two networks of one name (nodes of one machine may create it at
/// once): every node then takes the one with the smallest id.
async fn agent_network(docker: &Docker) -> Result<(String, std::net::IpAddr), String> {
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_at_a_time = CREATING.lock().await;
    let mut named = agent_networks(docker).await?;
    if named.is_empty() {
        let request = NetworkCreateRequest {
            name: AGENT_NETWORK.into(),
            driver: Some("bridge".into()),
            internal: Some(true),
            labels: Some(std::collections::HashMap::from([(
                "reprobench.role".to_string(),
                "agent-network".to_string(),
            )])),
            ..Default::default()
        };
        docker.create_network(request).await.map_err(|e| {
            format!("cannot create the agents' Docker network `{AGENT_NETWORK}`: {e}")
        })?;
        named = agent_networks(docker).await?;
    }
    named.sort_by(|a, b| a.id.cmp(&b.id));
    let network = named.into_iter().next().ok_or_else(|| {
        format!("Docker network `{AGENT_NETWORK}` was created but is not listed; try again")
    })?;
    let id = network.id.clone().unwrap_or_else(|| AGENT_NETWORK.into());
    if network.internal != Some(true) {
        return Err(format!(
            "Docker network `{AGENT_NETWORK}` exists but is not internal, so agents on it would reach the outside; remove it (`docker network rm {AGENT_NETWORK}`) and reprobench creates an internal one"
        ));
    }
    let ip = network
        .ipam
        .and_then(|ipam| ipam.config)
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.gateway.as_deref()?.parse::<std::net::IpAddr>().ok())
        .find(|ip| ip.is_ipv4())
        .ok_or_else(|| {
            format!(
                "Docker network `{AGENT_NETWORK}` has no IPv4 gateway address for the agents to reach the node's gateway; remove it (`docker network rm {AGENT_NETWORK}`) and reprobench creates it again"
            )
        })?;
    Ok((id, ip))
}

fn in_task(task_dir: &Path, host: &Path) -> String {
    match host.strip_prefix(task_dir) {
        Ok(rel) => format!("{TASK_MOUNT}/{}", rel.display()),
        Err(_) => host.display().to_string(),
    }
}

/// The container's environment and arguments for an invocation whose files live in `task_dir`.
pub fn container_env_and_args(
    inv: &ExternalInvocation<'_>,
    task_dir: &Path,
) -> (Vec<String>, Vec<String>) {
    let instance = in_task(task_dir, inv.instance_file);
    let output = in_task(task_dir, inv.output);
    let artifacts = in_task(task_dir, inv.artifacts);
    let env = vec![
        format!("OPENAI_BASE_URL={}", inv.base_url),
        format!("OPENAI_API_BASE={}", inv.base_url),
        format!("OPENAI_API_KEY={}", inv.key),
        format!("OPENAI_MODEL={}", inv.model),
        format!("REPROBENCH_INSTANCE={instance}"),
        format!("REPROBENCH_REPO={REPO_MOUNT}"),
        format!("REPROBENCH_OUTPUT={output}"),
        format!("REPROBENCH_ARTIFACTS={artifacts}"),
    ];
    let args = inv
        .command
        .iter()
        .map(|a| {
            a.replace("{instance}", &instance)
                .replace("{repo}", REPO_MOUNT)
                .replace("{output}", &output)
                .replace("{artifacts}", &artifacts)
        })
        .collect();
    (env, args)
}

async fn remove(docker: &Docker, id: &str) {
    let options = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    let _ = docker.remove_container(id, Some(options)).await;
}

/// Runs the agent's image to its end, its time budget, or cancellation (`None`). The
/// invocation's files must live in `task_dir` (mounted into the container); `gateway` is the one
/// `inv.base_url` names, served to the container on [`AGENT_NETWORK`].
pub async fn run(
    inv: &ExternalInvocation<'_>,
    gateway: &Gateway,
    image: &str,
    task_dir: &Path,
    cancel: &CancellationToken,
) -> Option<ExternalEnd> {
    let log = inv.artifacts.join("agent.log");
    let mut end = ExternalEnd {
        exit_code: None,
        timed_out: false,
        patch: None,
        start_error: None,
        log: log.clone(),
    };
    let _ = std::fs::create_dir_all(inv.artifacts);
    let docker = match Docker::connect_with_defaults() {
        Ok(d) => d,
        Err(e) => {
            end.start_error = Some(format!(
                "cannot reach the Docker engine to run image `{image}`: {e}"
            ));
            return Some(end);
        }
    };
    match docker.inspect_image(image).await {
        Ok(_) => {}
        Err(EngineError::DockerResponseServerError {
            status_code: 404, ..
        }) => {
            end.start_error = Some(format!(
                "image `{image}` is not on this node's Docker engine; build or load it there (`docker build -t {image} .`), no registry is pulled from"
            ));
            return Some(end);
        }
        Err(e) => {
            end.start_error = Some(format!("cannot inspect image `{image}`: {e}"));
            return Some(end);
        }
    }
    let (network, host) = match agent_network(&docker).await {
        Ok(found) => found,
        Err(e) => {
            end.start_error = Some(e);
            return Some(end);
        }
    };
    let served = match gateway.serve_also(host).await {
        Ok(addr) => addr,
        Err(e) => {
            end.start_error = Some(format!(
                "cannot serve the gateway on the agents' network at {host}: {e}"
            ));
            return Some(end);
        }
    };
    let base_url = format!("http://{served}/v1");
    let inv = ExternalInvocation {
        base_url: &base_url,
        ..*inv
    };
    let (env, args) = container_env_and_args(&inv, task_dir);
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: (!args.is_empty()).then_some(args),
        env: Some(env),
        working_dir: Some(REPO_MOUNT.into()),
        labels: Some(std::collections::HashMap::from([(
            "reprobench.role".to_string(),
            "external-agent".to_string(),
        )])),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        host_config: Some(HostConfig {
            network_mode: Some(network),
            binds: Some(vec![
                format!("{}:{REPO_MOUNT}", inv.repo.display()),
                format!("{}:{TASK_MOUNT}", task_dir.display()),
            ]),
            init: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = match docker
        .create_container(None::<CreateContainerOptions>, body)
        .await
    {
        Ok(r) => r.id,
        Err(e) => {
            end.start_error = Some(format!(
                "the Docker engine refused the agent container: {e}"
            ));
            return Some(end);
        }
    };
    let options = AttachContainerOptionsBuilder::new()
        .stream(true)
        .stdout(true)
        .stderr(true)
        .build();
    let attached = docker.attach_container(&id, Some(options)).await;
    let reader = attached.ok().map(|a| {
        let log = log.clone();
        tokio::spawn(async move {
            let mut out = a.output;
            let mut file = std::fs::File::create(&log).ok();
            while let Some(Ok(chunk)) = out.next().await {
                if let Some(f) = file.as_mut() {
                    let _ = f.write_all(chunk.as_ref());
                }
            }
        })
    });
    if let Err(e) = docker.start_container(&id, None).await {
        remove(&docker, &id).await;
        end.start_error = Some(format!("cannot start the agent container: {e}"));
        return Some(end);
    }
    let mut wait = Box::pin(docker.wait_container(&id, None));
    let cancelled = tokio::select! {
        status = wait.next() => {
            end.exit_code = match status {
                Some(Ok(s)) => Some(s.status_code as i32),
                Some(Err(EngineError::DockerContainerWaitError { code, .. })) => Some(code as i32),
                _ => None,
            };
            false
        }
        _ = tokio::time::sleep(inv.timeout) => {
            let _ = docker.kill_container(&id, None).await;
            end.timed_out = true;
            false
        }
        _ = cancel.cancelled() => true,
    };
    remove(&docker, &id).await;
    if let Some(r) = reader {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), r).await;
    }
    if cancelled {
        return None;
    }
    end.patch = std::fs::read_to_string(inv.output)
        .ok()
        .filter(|p| !p.trim().is_empty());
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn paths_are_given_as_the_container_sees_them() {
        let task = Path::new("/art/run/i/t1-e1");
        let cmd = vec![
            "--in".to_string(),
            "{instance}".to_string(),
            "{repo}".to_string(),
        ];
        let inv = ExternalInvocation {
            command: &cmd,
            instance_file: &task.join("instance.json"),
            repo: Path::new("/tmp/checkout-1"),
            output: &task.join("agent-output.patch"),
            artifacts: &task.join("agent"),
            base_url: "http://127.0.0.1:4000/v1",
            key: "rb-k",
            model: "m",
            timeout: Duration::from_secs(1),
        };
        let (env, args) = container_env_and_args(&inv, task);
        assert_eq!(args, ["--in", "/reprobench/task/instance.json", "/repo"]);
        assert!(env.contains(&"REPROBENCH_OUTPUT=/reprobench/task/agent-output.patch".to_string()));
        assert!(env.contains(&"REPROBENCH_REPO=/repo".to_string()));
        assert!(env.contains(&"OPENAI_BASE_URL=http://127.0.0.1:4000/v1".to_string()));
    }
}
