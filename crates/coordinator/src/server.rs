//! The gRPC edge: `NodeService` and `RunService` forwarding to the core, token checks, TLS,
//! the data directory (lock, token file, address file) and the server's lifetime. The core
//! speaks domain messages (`reprobench_domain::messages`); this is where they meet the wire
//! (`reprobench_proto::convert`), and where a [`Refused`] becomes a gRPC status.

use crate::core::{self, Command, CoreConfig, CoreHandle};
use crate::credentials::{
    AuthError, Credentials, CredentialsError, FileCredential, Opening, Principal,
};
use crate::machine::Refused;
use crate::store::{Store, StoreError};
use reprobench_domain::messages::{self as domain, NodeMessage as DomainNodeMessage};
use reprobench_proto::auth::TOKEN_METADATA_KEY;
use reprobench_proto::convert::messages::node_message as node_message_in;
use reprobench_proto::v1::node_service_server::{NodeService, NodeServiceServer};
use reprobench_proto::v1::run_service_server::{RunService, RunServiceServer};
use reprobench_proto::v1::*;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// File in the data directory holding the join token (mode 0600).
pub const TOKEN_FILE: &str = "token";
/// File in the data directory naming the address a live coordinator serves on.
pub const ADDRESS_FILE: &str = "serve.json";
const LOCK_FILE: &str = "coordinator.lock";
/// Largest gRPC message accepted by default (`serve --max-message-mib`): predictions and
/// instances travel inside requests and grants, and a runaway 10 MB patch must still reach the
/// node that classifies it.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How to run a coordinator.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Data directory (store, token, address file).
    pub data_dir: PathBuf,
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Token file; `DATA_DIR/token` when `None`. Created with mode 0600 if absent.
    pub token_file: Option<PathBuf>,
    /// PEM certificate and key for TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Lease timing and policy.
    pub core: CoreConfig,
    /// Credentials given in files (`serve --credential`), known besides the data directory's.
    pub credential_files: Vec<FileCredential>,
    /// Largest message taken or sent ([`MAX_MESSAGE_BYTES`] unless `serve --max-message-mib`).
    pub max_message_bytes: usize,
}

/// Problems starting a coordinator.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Filesystem trouble with the data directory.
    #[error("data directory {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Another coordinator holds the data directory.
    #[error("another coordinator is already serving {0}; stop it, or pick another --data DIR")]
    Locked(PathBuf),
    /// The store cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// TLS files are unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The credentials cannot be read or made.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ServeError + '_ {
    move |source| ServeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A running coordinator.
pub struct Coordinator {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The admin credential's token.
    pub token: String,
    /// Where the admin token lives.
    pub token_file: PathBuf,
    /// How the credentials were found: made, upgraded from a join token, or already there.
    pub credentials_opening: Opening,
    address_file: PathBuf,
    core: CoreHandle,
    core_join: Option<std::thread::JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    _lock: std::fs::File,
}

impl Coordinator {
    /// A handle to the core, for what runs beside the gRPC services (metrics, Kubernetes).
    pub fn core(&self) -> CoreHandle {
        self.core.clone()
    }

    /// Why the core stopped on its own, when it does (a store write failed): the owner must then
    /// stop the coordinator, and a restart on the same data directory resumes.
    pub fn failure(&self) -> core::CoreFailure {
        self.core.failure()
    }

    /// Stops serving, lets the core commit its last batch, and returns.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.server).await;
        let _ = self.core.send(Command::Shutdown);
        if let Some(j) = self.core_join.take() {
            let _ = tokio::task::spawn_blocking(move || j.join()).await;
        }
        let _ = std::fs::remove_file(&self.address_file);
    }
}

/// Opens the data directory and store, and starts serving.
pub async fn start(cfg: ServeConfig) -> Result<Coordinator, ServeError> {
    std::fs::create_dir_all(&cfg.data_dir).map_err(io_err(&cfg.data_dir))?;
    let lock = lock_data_dir(&cfg.data_dir)?;
    let token_file = cfg
        .token_file
        .clone()
        .unwrap_or_else(|| cfg.data_dir.join(TOKEN_FILE));
    // A join token beside an existing store is an upgrade; beside a new one, the user's choice.
    let had_store = cfg.data_dir.join(crate::store::DB_FILE).exists();
    let (credentials, opening) = Credentials::open(
        &cfg.data_dir,
        &token_file,
        &cfg.credential_files,
        reprobench_domain::time::now_ms(),
    )?;
    let token = std::fs::read_to_string(&token_file)
        .map_err(io_err(&token_file))?
        .trim()
        .to_string();
    let opening = match opening {
        Opening::Upgraded if !had_store => Opening::Created,
        other => other,
    };
    if opening == Opening::Upgraded {
        tracing::warn!(
            token = %token_file.display(),
            "upgraded: the join token is now an admin credential; give nodes node credentials and clients client credentials (`reprobench credential add`)"
        );
    }
    let credentials = Arc::new(Mutex::new(credentials));
    let store = Store::open(&cfg.data_dir)?;
    let (core, core_join) = core::spawn(store, cfg.core.clone())?;

    let listener = std::net::TcpListener::bind(cfg.listen).map_err(io_err(&cfg.data_dir))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err(&cfg.data_dir))?;
    let addr = listener.local_addr().map_err(io_err(&cfg.data_dir))?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(io_err(&cfg.data_dir))?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));

    let mut builder = Server::builder();
    let scheme = if let Some((cert, key)) = &cfg.tls {
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| ServeError::Tls(format!("cannot read {}: {e}", p.display())))
        };
        let identity = Identity::from_pem(read(cert)?, read(key)?);
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(|e| ServeError::Tls(e.to_string()))?;
        "https"
    } else {
        "http"
    };
    let auth = TokenCheck {
        credentials: credentials.clone(),
        token_file: token_file.clone(),
    };
    let nodes = InterceptedService::new(
        NodeServiceServer::new(NodeApi {
            core: core.clone(),
            conns: Arc::new(AtomicU64::new(1)),
            max_node_queue: cfg.core.max_node_queue,
            credentials,
        })
        .max_decoding_message_size(cfg.max_message_bytes),
        auth.clone(),
    );
    let runs = InterceptedService::new(
        RunServiceServer::new(RunApi {
            core: core.clone(),
            data_dir: cfg.data_dir.clone(),
        })
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes),
        auth,
    );
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(
        builder
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
            .add_service(nodes)
            .add_service(runs)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_rx.await;
            }),
    );
    let url = format!("{scheme}://{addr}");
    let address = serde_json::json!({ "url": url, "pid": std::process::id() });
    let address_path = cfg.data_dir.join(ADDRESS_FILE);
    std::fs::write(&address_path, format!("{address}\n")).map_err(io_err(&address_path))?;
    tracing::info!(%url, data = %cfg.data_dir.display(), "coordinator serving");
    Ok(Coordinator {
        addr,
        token,
        token_file,
        credentials_opening: opening,
        address_file: address_path,
        core,
        core_join: Some(core_join),
        stop: Some(stop_tx),
        server,
        _lock: lock,
    })
}

/// Reads the address file a live coordinator wrote into a data directory.
pub fn served_url(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(ADDRESS_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("url")?.as_str().map(str::to_string)
}

/// Takes the data directory's coordinator lock (held by a serving coordinator or a local cluster);
/// whoever holds it is the store's only writer.
pub fn lock_data_dir(dir: &Path) -> Result<std::fs::File, ServeError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    // SAFETY: flock on a valid descriptor we own; the lock lives as long as the file handle.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(ServeError::Locked(dir.to_path_buf()));
    }
    Ok(file)
}

/// Finds the credential of each call and puts its [`Principal`] into the request's extensions.
#[derive(Clone)]
struct TokenCheck {
    credentials: Arc<Mutex<Credentials>>,
    token_file: PathBuf,
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let given = req
            .metadata()
            .get(TOKEN_METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let checked = self
            .credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .authenticate(given);
        let admin = self.token_file.display();
        match checked {
            Ok(principal) => {
                req.extensions_mut().insert(principal);
                Ok(req)
            }
            Err(AuthError::Missing) => Err(Status::unauthenticated(format!(
                "no credential was presented: pass --token-file with one. The admin credential is in {admin} on the coordinator's machine, and `reprobench credential add --role client|node --data DIR` there makes the others"
            ))),
            Err(AuthError::Unknown) => Err(Status::unauthenticated(format!(
                "the coordinator does not know this credential (another coordinator's, or mistyped): use one it made, such as the admin credential in {admin} on its machine, or one from `reprobench credential add` there"
            ))),
            Err(AuthError::Revoked(id)) => Err(Status::unauthenticated(format!(
                "credential {id} was revoked: ask the coordinator's admin for a new one (`reprobench credential add`)"
            ))),
        }
    }
}

/// The caller the interceptor found (every service is behind it).
fn principal<T>(req: &Request<T>) -> Result<Principal, Status> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("the call reached a service without its credential check"))
}

struct NodeApi {
    core: CoreHandle,
    conns: Arc<AtomicU64>,
    /// `CoreConfig::max_node_queue`.
    max_node_queue: usize,
    credentials: Arc<Mutex<Credentials>>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A refusal of the core or its machine as the gRPC status of the same name.
impl From<Refused> for Status {
    fn from(r: Refused) -> Status {
        match r {
            Refused::NotFound(m) => Status::not_found(m),
            Refused::InvalidArgument(m) => Status::invalid_argument(m),
            Refused::FailedPrecondition(m) => Status::failed_precondition(m),
            Refused::AlreadyExists(m) => Status::already_exists(m),
            Refused::PermissionDenied(m) => Status::permission_denied(m),
            Refused::Unavailable(m) => Status::unavailable(m),
            Refused::ResourceExhausted(m) => Status::resource_exhausted(m),
        }
    }
}

async fn ask<T>(
    core: &CoreHandle,
    make: impl FnOnce(oneshot::Sender<T>) -> Command,
) -> Result<T, Status> {
    let (tx, rx) = oneshot::channel();
    core.send(make(tx))?;
    rx.await.map_err(|_| core.stopped().into())
}

/// The core's stream of domain values as the wire's stream; a refusal ends it as a status.
fn wire_stream<D, W>(rx: mpsc::Receiver<Result<D, Refused>>) -> BoxStream<W>
where
    D: Send + 'static,
    W: From<D> + Send + 'static,
{
    Box::pin(ReceiverStream::new(rx).map(|item| item.map(W::from).map_err(Status::from)))
}

/// A registration as the core takes it: the node speaks this coordinator's protocol, and
/// offers only kinds this build knows.
fn registration(req: RegisterRequest) -> Result<domain::Registration, Status> {
    let version = reprobench_proto::PROTOCOL_VERSION;
    if req.protocol_version != version {
        return Err(Status::failed_precondition(format!(
            "node `{}` speaks protocol v{} but this coordinator speaks v{version}; run the same reprobench release on the coordinator and its nodes",
            req.node_id, req.protocol_version
        )));
    }
    domain::Registration::try_from(req).map_err(Status::invalid_argument)
}

#[tonic::async_trait]
impl NodeService for NodeApi {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let caller = principal(&req)?;
        let req = req.into_inner();
        if let Some(refusal) = caller.node_refusal(&req.node_id) {
            return Err(Status::permission_denied(refusal));
        }
        let req = registration(req)?;
        let registered = ask(&self.core, |reply| Command::Register { req, reply }).await??;
        Ok(Response::new(registered.into()))
    }

    type WorkStream = BoxStream<CoordinatorMessage>;

    async fn work(
        &self,
        req: Request<Streaming<NodeMessage>>,
    ) -> Result<Response<Self::WorkStream>, Status> {
        let caller = principal(&req)?;
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .and_then(|m| m.body)
            .and_then(node_message_in);
        let Some(DomainNodeMessage::Hello(hello)) = first else {
            return Err(Status::invalid_argument(
                "the first message on a Work stream must be Hello",
            ));
        };
        if let Some(refusal) = caller.node_refusal(&hello.node_id) {
            return Err(Status::permission_denied(refusal));
        }
        let node_id = hello.node_id.clone();
        let conn = self.conns.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crate::core::node_channel(self.max_node_queue);
        self.core.send(Command::Connect {
            node_id: node_id.clone(),
            conn,
            hello,
            out: tx,
        })?;
        let core = self.core.clone();
        let credentials = self.credentials.clone();
        tokio::spawn(async move {
            while let Ok(Some(msg)) = inbound.message().await {
                // A revoked credential's stream ends at its next message (heartbeats come often).
                let live = credentials
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_live(&caller.id);
                if !live {
                    tracing::warn!(node = %node_id, credential = %caller.id, "credential revoked: closing the node's stream");
                    break;
                }
                // A message this build cannot read (a credit of a kind it does not know) is
                // dropped: no slot of that kind was registered.
                if let Some(body) = msg.body.and_then(node_message_in)
                    && core
                        .send(Command::FromNode {
                            node_id: node_id.clone(),
                            conn,
                            body,
                        })
                        .is_err()
                {
                    return;
                }
            }
            let _ = core.send(Command::Disconnect { node_id, conn });
        });
        Ok(Response::new(wire_stream(rx)))
    }
}

/// The caller of a run call, refused when its credential is a node's.
fn run_caller<T>(req: &Request<T>) -> Result<Principal, Status> {
    let caller = principal(req)?;
    match caller.client_refusal() {
        Some(refusal) => Err(Status::permission_denied(refusal)),
        None => Ok(caller),
    }
}

struct RunApi {
    core: CoreHandle,
    data_dir: PathBuf,
}

#[tonic::async_trait]
impl RunService for RunApi {
    async fn submit_run(
        &self,
        req: Request<SubmitRunRequest>,
    ) -> Result<Response<SubmitRunResponse>, Status> {
        let owner = run_caller(&req)?.id;
        let req = req.into_inner().into();
        let submitted = ask(&self.core, |reply| Command::Submit { req, owner, reply }).await??;
        Ok(Response::new(submitted.into()))
    }

    type WatchRunStream = BoxStream<RunProgress>;

    async fn watch_run(
        &self,
        req: Request<WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        run_caller(&req)?;
        let (tx, rx) = mpsc::channel(16);
        self.core.send(Command::Watch {
            run_id: req.into_inner().run_id,
            tx,
        })?;
        Ok(Response::new(wire_stream(rx)))
    }

    async fn cancel_run(
        &self,
        req: Request<CancelRunRequest>,
    ) -> Result<Response<CancelRunResponse>, Status> {
        let caller = run_caller(&req)?;
        let run_id = req.into_inner().run_id;
        let n = ask(&self.core, |reply| Command::Cancel {
            run_id,
            caller,
            reply,
        })
        .await??;
        Ok(Response::new(CancelRunResponse { cancelled_tasks: n }))
    }

    async fn list_runs(
        &self,
        req: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        run_caller(&req)?;
        let list = ask(&self.core, |reply| Command::List { reply }).await?;
        Ok(Response::new(list.into()))
    }

    type ExportResultsStream = BoxStream<ResultRow>;

    async fn export_results(
        &self,
        req: Request<ExportResultsRequest>,
    ) -> Result<Response<Self::ExportResultsStream>, Status> {
        run_caller(&req)?;
        let run_id = req.into_inner().run_id;
        let dir = self.data_dir.clone();
        let rows = tokio::task::spawn_blocking(move || -> Result<Vec<_>, Status> {
            let store = Store::open_read_only(&dir).map_err(|e| Status::internal(e.to_string()))?;
            if store
                .sweep_toml(&run_id)
                .map_err(|e| Status::internal(e.to_string()))?
                .is_none()
            {
                return Err(crate::machine::no_such_run(&run_id).into());
            }
            store
                .results(&run_id)
                .map_err(|e| Status::internal(e.to_string()))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(Box::pin(tokio_stream::iter(
            rows.into_iter().map(|row| Ok(row.into())),
        ))))
    }
}
