//! The client side of the join token and of TLS: reading the token file and opening an
//! authenticated channel to a coordinator.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Metadata key that carries the token (`authorization: Bearer <token>`).
pub const TOKEN_METADATA_KEY: &str = "authorization";

/// A channel that adds the join token to every call.
pub type AuthedChannel = InterceptedService<Channel, TokenInterceptor>;

/// Problems reaching or authenticating with a coordinator, each saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The token file cannot be read.
    #[error(
        "cannot read the credential from {path}: {source}. The coordinator writes its admin credential when `reprobench serve` first starts (DATA_DIR/token), and `reprobench credential add --data DATA_DIR` makes node and client credentials there; copy one here and pass --token-file"
    )]
    TokenFile {
        /// The file that was tried.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The token file holds no usable token.
    #[error(
        "the credential file {0} is empty or not plain text; copy the credential again (the admin one is the coordinator's DATA_DIR/token)"
    )]
    BadToken(PathBuf),
    /// The URL is malformed.
    #[error(
        "coordinator URL `{0}` is not valid; write it like http://HOST:PORT (https:// with --tls-ca)"
    )]
    BadUrl(String),
    /// TLS settings cannot be used.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The coordinator did not answer.
    #[error(
        "cannot reach the coordinator at {url}: {reason}. Is `reprobench serve` running there, and is the address right?"
    )]
    Unreachable {
        /// The URL that was tried.
        url: String,
        /// The transport error.
        reason: String,
    },
}

/// Reads a join token from a file (surrounding whitespace ignored).
pub fn read_token(path: &Path) -> Result<String, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientError::TokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim().to_string();
    if token.is_empty() || !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(ClientError::BadToken(path.to_path_buf()));
    }
    Ok(token)
}

/// Adds `authorization: Bearer <token>` to each request.
#[derive(Clone)]
pub struct TokenInterceptor(MetadataValue<Ascii>);

impl TokenInterceptor {
    /// An interceptor for `token` (which must be printable ASCII, as [`read_token`] ensures).
    pub fn new(token: &str) -> Self {
        let value = format!("Bearer {token}")
            .parse()
            .unwrap_or_else(|_| MetadataValue::from_static(""));
        TokenInterceptor(value)
    }
}

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert(TOKEN_METADATA_KEY, self.0.clone());
        Ok(req)
    }
}

/// Where and how to reach a coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorAddress {
    /// `http://HOST:PORT` or `https://HOST:PORT`.
    pub url: String,
    /// The join token.
    pub token: String,
    /// CA certificate (PEM) that signed the coordinator's certificate, for https.
    pub tls_ca: Option<PathBuf>,
    /// The name the coordinator's certificate must carry, when the URL names it otherwise (an
    /// IP address, a port-forward to 127.0.0.1); `None`: the URL's host.
    pub tls_server_name: Option<String>,
}

impl CoordinatorAddress {
    /// Opens a channel (fails fast when nobody answers) with the token attached to every call.
    pub async fn connect(&self) -> Result<AuthedChannel, ClientError> {
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|_| ClientError::BadUrl(self.url.clone()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));
        if let Some(ca) = &self.tls_ca {
            let pem = std::fs::read(ca).map_err(|e| {
                ClientError::Tls(format!("cannot read CA file {}: {e}", ca.display()))
            })?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            if let Some(name) = &self.tls_server_name {
                tls = tls.domain_name(name.clone());
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| ClientError::Tls(e.to_string()))?;
        } else if self.url.starts_with("https://") {
            return Err(ClientError::Tls(format!(
                "{} is https but no --tls-ca was given; pass the CA certificate that signed the coordinator's certificate",
                self.url
            )));
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| ClientError::Unreachable {
                url: self.url.clone(),
                reason: error_chain(&e),
            })?;
        Ok(InterceptedService::new(
            channel,
            TokenInterceptor::new(&self.token),
        ))
    }

    /// A `RunService` client over [`Self::connect`] with no message limit of its own: the
    /// coordinator's (`serve --max-message-mib`) is the one that holds (a run's attachments and
    /// result exports are large).
    pub async fn run_client(
        &self,
    ) -> Result<crate::v1::run_service_client::RunServiceClient<AuthedChannel>, ClientError> {
        Ok(
            crate::v1::run_service_client::RunServiceClient::new(self.connect().await?)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX),
        )
    }
}

/// An error and its sources on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = inner.source();
    }
    s
}
